"""The README's cuzkd commands are real: every flag it names exists, every example parses.

A newcomer copies commands from the README literally; one flag that does not exist (the
README once told to give cuzkd ``--stop-timeout``, a docker flag) ends the first hour. The
pages the README's reference moved to are held the same way.
"""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest

from cuzkd.cli.dispatch import build_parser
from cuzkd.cli.swap_commands import join_smoke_value

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
#: the README and the pages its configuration and supervisor reference moved to
PAGES = (README, *(ROOT / "docs" / name for name in ("configuration.md", "supervisor.md",
                                                     "door.md")))
#: ``cuzkd SUBCOMMAND ...`` (also ``.venv/bin/cuzkd``), up to a shell operator or the span's end
_COMMAND_RE = re.compile(r"(?:^|[\s`(/])cuzkd ((?:[a-z-]+\|)*[a-z-]+)([^`&|;\n]*)")
_FLAG_RE = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def _mentions(page: Path) -> list[tuple[str, str]]:
    """(subcommand, rest of the line) for each cuzkd command in code blocks or code spans."""
    text = page.read_text(encoding="utf-8").replace("\\\n", " ")
    spans = re.findall(r"```sh\n(.*?)```", text, re.S) + re.findall(r"`([^`\n]+)`", text)
    found = []
    for span in spans:
        for line in span.splitlines():
            line = line.split(" #", 1)[0]
            for match in _COMMAND_RE.finditer(line):
                for sub in match.group(1).split("|"):
                    found.append((sub, match.group(2)))
    return found


def test_the_readme_names_cuzkd_commands() -> None:
    subs = {sub for sub, _ in _mentions(README)}
    assert {"run", "status", "swap", "engine", "bench", "check-config"} <= subs


@pytest.mark.parametrize(("sub", "rest"), [m for page in PAGES for m in _mentions(page)])
def test_every_flag_the_readme_names_exists(sub: str, rest: str) -> None:
    parsers = _subparsers()
    assert sub in parsers, f"`cuzkd {sub}` is not a command"
    known = {o for a in parsers[sub]._actions for o in a.option_strings}
    # "--smoke" takes an argument that is itself a flag of the smoked binary
    flags = _FLAG_RE.findall(re.sub(r'--smoke[ =]"[^"]*"', "", rest))
    assert set(flags) <= known, f"cuzkd {sub}{rest}: unknown {sorted(set(flags) - known)}"


def _concrete(page: Path) -> list[str]:
    """Commands in ``sh`` blocks that have no placeholders: they must parse as written."""
    out = []
    text = page.read_text(encoding="utf-8").replace("\\\n", " ")
    for block in re.findall(r"```sh\n(.*?)```", text, re.S):
        for line in block.splitlines():
            for match in _COMMAND_RE.finditer(line.split(" #", 1)[0]):
                if "|" not in match.group(1):
                    out.append(f"{match.group(1)}{match.group(2)}".strip())
    return out


@pytest.mark.parametrize("command", [c for page in PAGES for c in _concrete(page)])
def test_every_example_command_parses(command: str) -> None:
    build_parser().parse_args(join_smoke_value(shlex.split(command)))
