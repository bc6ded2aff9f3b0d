"""The fleet recording rules (prometheus/cuzkd-recording.yml) and their promtool unit tests.

promtool checks the syntax and runs the unit tests. On top: every name follows
``level:metric:operations`` with the level naming exactly the labels the rule keeps, every
metric read is in the exporter contract (or recorded earlier in the same group), and the unit
tests really cover each rule: replacing any rule's expression must break them.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from support import ops

PROM = ops.REPO / "prometheus"
RULES = PROM / "cuzkd-recording.yml"
RULE_TESTS = PROM / "tests" / "cuzkd-recording.test.yml"
SERIES = {**ops.series_contract(), **ops.PROMETHEUS_SERIES}
NAME = re.compile(r"(?P<level>[a-z_]+):(?P<metric>[a-z_]+):(?P<ops>[a-z0-9_]+)")


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    if shutil.which("promtool") is None:
        pytest.fail("promtool not installed (apt-get install prometheus; see scripts/test.sh)")
    return subprocess.run(["promtool", *args], capture_output=True, text=True, timeout=60,
                          check=False)


def _groups() -> list[dict[str, Any]]:
    return list(yaml.safe_load(RULES.read_text(encoding="utf-8"))["groups"])


RECORDS = {r["record"]: r for g in _groups() for r in g["rules"]}


def test_rules_are_valid_and_only_recording_rules() -> None:
    result = _promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{len(RECORDS)} rules found" in result.stdout
    assert all(set(r) == {"record", "expr"} for r in RECORDS.values())


def test_rule_unit_tests_pass() -> None:
    result = _promtool("test", "rules", str(RULE_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("record", sorted(RECORDS))
def test_name_says_level_and_the_level_is_the_labels_kept(record: str) -> None:
    match = NAME.fullmatch(record)
    assert match, f"{record} is not level:metric:operations"
    level = match["level"].replace("proof_kind", "proof-kind").split("_")
    expected = {label.replace("-", "_") for label in level} | {"job"}
    assert ops.recorded_series()[record].labels == expected


def test_rules_read_contract_metrics_or_earlier_records_of_their_group() -> None:
    for group in _groups():
        recorded: set[str] = set()
        for rule in group["rules"]:
            tree = ops.parse(rule["expr"])
            for selector in ops.selectors(tree):
                assert selector.name in SERIES or selector.name in recorded, (
                    f"{rule['record']} reads {selector.name}, which is neither exported nor "
                    "recorded before it in its group")
            assert ops.counter_misuse(tree, SERIES, ranges=None) == []
            recorded.add(rule["record"])


def test_unit_tests_check_every_record() -> None:
    doc = yaml.safe_load(RULE_TESTS.read_text(encoding="utf-8"))
    assert doc["rule_files"] == ["../cuzkd-recording.yml"]
    checked = {case["expr"] for test in doc["tests"] for case in test["promql_expr_test"]
               if case["exp_samples"]}
    assert checked == set(RECORDS)


def _readers(record: str) -> set[str]:
    """``record`` and every record that reads it, directly or through another record."""
    names = {record}
    while True:
        more = {r for r, rule in RECORDS.items() if any(n in rule["expr"] for n in names)}
        if more <= names:
            return names
        names |= more


def _tests_reading(record: str) -> dict[str, Any]:
    """The unit tests, less the test groups that name neither ``record`` nor a record reading
    it: those cannot notice ``record`` changed and would only cost promtool time."""
    tests = yaml.safe_load(RULE_TESTS.read_text(encoding="utf-8"))
    names = _readers(record)
    tests["tests"] = [t for t in tests["tests"] if any(n in yaml.safe_dump(t) for n in names)]
    return dict(tests)


def test_unit_tests_fail_when_any_record_is_broken(tmp_path: Path) -> None:
    """Each rule's expression replaced by a constant: the unit tests must fail every time
    (one promtool run for all mutants, each beside only the tests that can notice it)."""
    files = {}
    for record in sorted(RECORDS):
        root = tmp_path / record.replace(":", "_")
        groups = _groups()
        for group in groups:
            for rule in group["rules"]:
                if rule["record"] == record:
                    rule["expr"] = "vector(1)"
        (root / "tests").mkdir(parents=True)
        (root / RULES.name).write_text(yaml.safe_dump({"groups": groups}))
        files[record] = root / "tests" / RULE_TESTS.name
        files[record].write_text(yaml.safe_dump(_tests_reading(record)))
    result = _promtool("test", "rules", *map(str, files.values()))
    sections = (result.stdout + result.stderr).split("Unit Testing:")[1:]
    assert len(sections) == len(files), result.stdout + result.stderr
    passed = {section.split()[0] for section in sections if "SUCCESS" in section}
    assert not [record for record, path in files.items() if str(path) in passed]
