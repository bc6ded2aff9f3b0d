"""Every docs path and section the tree names exists, and every alert has its runbook row.

Comments, docstrings, config files and the docs send readers to pages under docs/ and to their
sections (a ``#anchor`` link, or a heading quoted after the path); a page or heading moved
without its references leaves a newcomer at a dead end. Anchors are GitHub's heading slugs.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
#: where docs are named: the package, its tests, the ops files, the docs themselves
SCANNED_DIRS = ("cuzkd", "tests", "bench", "grafana", "deploy", "prometheus", "systemd",
                "scripts", "docs")
SCANNED_FILES = ("README.md", "Dockerfile", "cuzkd.example.toml", "pyproject.toml")
TEXT_SUFFIXES = frozenset({".py", ".md", ".toml", ".yml", ".yaml", ".json", ".sh", ".service",
                           ".socket", ".proto", ".txt", ".jsonnet", ".cfg", ""})
ALERTS = ROOT / "prometheus" / "cuzkd-alerts.yml"
RUNBOOK = DOCS / "operations.md"
RUNBOOK_HEADING = "### Alerts"
#: pages of other projects that the tree names by their own path
FOREIGN = {"web-configuration.md"}  # exporter-toolkit's, in cuzkd/config/webconfig.py

#: a docs page's path with an optional ``#anchor``, not part of a longer path or URL
_DOCS_PATH = re.compile(r"(?<![\w./-])docs/([\w/-]+\.md)(#[\w-]+)?")
#: a section named after the path: ``, *Heading*`` or ``("Heading")``
_SECTION = re.compile(r"(?<![\w./-])docs/([\w/-]+\.md),? \(?(?:\*([^*\n]+)\*|\"([^\"\n]+)\")")
#: a relative Markdown link: ``[text](page.md#anchor)``, ``[text](#anchor)``
_MD_LINK = re.compile(r"\]\((?!https?:|mailto:)([^)\s]*?)(#[^)\s]+)?\)")


def _scanned() -> Iterator[Path]:
    for name in SCANNED_DIRS:
        for path in sorted((ROOT / name).rglob("*")):
            if path.is_file() and path.suffix in TEXT_SUFFIXES and "__pycache__" not in path.parts:
                yield path
    yield from (ROOT / name for name in SCANNED_FILES if (ROOT / name).exists())


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@cache
def headings(page: Path) -> tuple[str, ...]:
    """The page's headings, outside fenced code blocks."""
    found, fenced = [], False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (match := re.match(r"#{1,6} (.+)", line)):
            found.append(match.group(1))
    return tuple(found)


@cache
def anchors(page: Path) -> frozenset[str]:
    """Every anchor GitHub gives the page: repeated slugs get ``-1``, ``-2``, ..."""
    seen: dict[str, int] = {}
    out = set()
    for heading in headings(page):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return frozenset(out)


def _plain(text: str) -> str:
    return re.sub(r"[`*_]", "", text).strip().lower()


def _references() -> Iterator[tuple[str, Path, str | None, str | None]]:
    """(where, the page named, its anchor, a heading quoted after it) for every reference."""
    for path in _scanned():
        text = path.read_text(encoding="utf-8", errors="replace")
        where = str(path.relative_to(ROOT))
        for match in _DOCS_PATH.finditer(text):
            if match.group(1) in FOREIGN:
                continue
            yield where, DOCS / match.group(1), (match.group(2) or "")[1:] or None, None
        for match in _SECTION.finditer(text):
            yield where, DOCS / match.group(1), None, match.group(2) or match.group(3)
        if path.suffix == ".md":
            for match in _MD_LINK.finditer(text):
                target, anchor = match.group(1), (match.group(2) or "")[1:] or None
                page = (path.parent / target).resolve() if target else path
                yield where, page, anchor if page.suffix == ".md" else None, None


REFERENCES = [
    pytest.param(where, page, anchor, section,
                 id=f"{where}:{page.relative_to(ROOT)}#{anchor or section or ''}")
    for where, page, anchor, section in sorted(set(_references()), key=str)]


def test_the_scan_finds_references() -> None:
    assert len(REFERENCES) > 100


@pytest.mark.parametrize(("where", "page", "anchor", "section"), REFERENCES)
def test_every_reference_leads_somewhere(where: str, page: Path, anchor: str | None,
                                         section: str | None) -> None:
    assert page.exists(), f"{where} names {page.relative_to(ROOT)}, which does not exist"
    if anchor is not None:
        assert anchor in anchors(page), f"{where}: no heading of {page.name} has #{anchor}"
    if section is not None:
        assert any(_plain(h).startswith(_plain(section)) for h in headings(page)), \
            f"{where}: no heading of {page.name} begins with {section!r}"


@pytest.mark.parametrize(("heading", "expected"), [
    ("Slow readers: bounded responses (memory and time)",
     "slow-readers-bounded-responses-memory-and-time"),
    ("Spawning: preexec_fn while threads run", "spawning-preexec_fn-while-threads-run"),
    ("Control API (Unix socket, 0600)", "control-api-unix-socket-0600"),
    ("TLS and basic auth (`[metrics] web_config`)", "tls-and-basic-auth-metrics-web_config"),
])
def test_slugs_are_githubs(heading: str, expected: str) -> None:
    assert slug(heading) == expected


def _alerts() -> list[dict[str, Any]]:
    rules = yaml.safe_load(ALERTS.read_text(encoding="utf-8"))
    return [rule for group in rules["groups"] for rule in group["rules"] if "alert" in rule]


def _runbook_rows() -> set[str]:
    text = RUNBOOK.read_text(encoding="utf-8")
    section = text.split(RUNBOOK_HEADING + "\n", 1)[1].split("\n#", 1)[0]
    return set(re.findall(r"^\| (Cuzkd\w+) \|", section, re.MULTILINE))


def test_every_alert_has_a_runbook_row_and_every_row_an_alert() -> None:
    assert {str(rule["alert"]) for rule in _alerts()} == _runbook_rows()


def test_runbook_urls_lead_to_a_docs_heading() -> None:
    """An alert's ``runbook_url`` names a page and anchor of this repository's docs."""
    for rule in _alerts():
        url = (rule.get("annotations") or {}).get("runbook_url")
        if url is None:
            continue
        match = _DOCS_PATH.search(str(url))
        assert match, f"{rule['alert']}: runbook_url {url} names no docs page"
        page, anchor = DOCS / match.group(1), (match.group(2) or "")[1:]
        assert page.exists() and (not anchor or anchor in anchors(page)), url
