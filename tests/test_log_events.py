"""The log-event table of docs/operations.md and the code say the same, and names keep the rule.

Operators query the ``event`` and ``logger`` fields (Loki, journald, alert annotations), so
every event cuzkd logs has a row in the table (event, logger, level, when, key fields) and every
row names an event some code logs. The events are found in the source, not by running it: an
AST walk finds each structlog call (``log.info("...")``, ``(log.info if ... else
log.warning)("...")``, a rate-limited ``limited.log(logger, "error", "...")``) and its literal
event name. A call whose event is not a literal is refused unless listed in
:data:`DYNAMIC_EVENTS` with where its names come from, so no event escapes the table.

The rule (docs/operations.md, *Log events*): an event is ``<subject>_<what happened>``, snake
case, in one tense: a past participle (``engine_killed``, ``supervisor_reloaded``), a state
(``engine_stopping``, ``binary_store_unusable``) or ``<subject>_<verb>_failed`` / ``_refused``;
never a bare verb or noun (``engine_kill``, ``engine_state``) or a verb without its subject
(``reloaded``). A logger is ``cuzkd.<component>``, given as a literal, never ``__name__``.

To add rows (another part's events), add them to the table: the test reads every row of the
section, nothing else needs to change.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from cuzkd.supervisor.core import signals

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "cuzkd"
TABLE_DOC = ROOT / "docs" / "operations.md"
TABLE_HEADING = "## Log events"

LEVEL_METHODS = frozenset({"debug", "info", "warning", "error", "exception", "critical"})
#: ``log.exception`` writes an ``error`` line (with the traceback).
LEVEL_OF_METHOD = {"exception": "error"}


def _signal_events() -> dict[str, set[str]]:
    """The events the signal handler logs: signals.decide()'s Decision carries them."""
    found: dict[str, set[str]] = {}
    for decision in signals.Decision:
        if decision.event is not None:
            found.setdefault(decision.event, set()).add(decision.level)
    return found


#: Calls whose event is not a literal: the file, and the events it can log with their levels.
DYNAMIC_EVENTS = {"cuzkd/supervisor/daemon/root.py": _signal_events()}
#: Events whose ``logger`` field is not their module's logger, and what the table says instead.
LOGGER_OVERRIDDEN = {"library_logged": "aiohttp.*"}  # the bridged stdlib record's own name
#: The last words an event may end with besides ``-ed``/``-ing``: irregular participles and
#: states. A new word here is a decision about the vocabulary, not a way round the rule.
IRREGULAR_ENDINGS = ("_broken", "_caught", "_cut", "_done", "_left", "_lost", "_output")
#: A phrasal verb's particle after its participle (``rolled_back``, ``timed_out``).
PARTICLES = ("_back", "_out")
STATE_ENDINGS = ("_partial", "_unexpected", "_unknown", "_unloggable", "_unreadable",
                 "_unusable", "_out_of_order")
EVENT_SHAPE = re.compile(r"[a-z][a-z0-9]*(_[a-z0-9]+)+")
LOGGER_SHAPE = re.compile(r"cuzkd\.[a-z]+")


@dataclass
class Logged:
    """What the code logs under one event name: at which levels, on which loggers, where."""

    levels: set[str] = field(default_factory=set)
    #: the module's logger when the call is made on it; None: a logger handed in (unchecked)
    loggers: set[str | None] = field(default_factory=set)
    sites: list[str] = field(default_factory=list)


@dataclass
class Row:
    event: str
    #: the loggers the row names (an event both the supervisor and the bundled engine log)
    loggers: set[str]
    levels: set[str]


def _literals(node: ast.expr) -> list[str] | None:
    """The strings ``node`` can be: a literal, or a conditional between literals."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.IfExp):
        body, orelse = _literals(node.body), _literals(node.orelse)
        return None if body is None or orelse is None else body + orelse
    return None


def _level_calls(func: ast.expr) -> list[ast.Attribute] | None:
    """``log.info`` or ``(log.info if ... else log.warning)``: the attribute(s) called."""
    if isinstance(func, ast.Attribute) and func.attr in LEVEL_METHODS:
        return [func]
    if isinstance(func, ast.IfExp):
        body, orelse = _level_calls(func.body), _level_calls(func.orelse)
        return None if body is None or orelse is None else body + orelse
    return None


def _module_loggers(tree: ast.Module) -> dict[str, str]:
    """Module-level ``NAME = structlog.get_logger("cuzkd.x")``: NAME -> the logger's name."""
    found = {}
    for stmt in tree.body:
        if (isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Call)
                and isinstance(stmt.value.func, ast.Attribute)
                and stmt.value.func.attr == "get_logger" and stmt.value.args):
            names = _literals(stmt.value.args[0])
            for target in stmt.targets:
                if isinstance(target, ast.Name) and names:
                    found[target.id] = names[0]
    return found


def _log_calls(tree: ast.Module) -> Iterator[tuple[ast.Call, ast.expr, set[str] | None,
                                                   ast.expr]]:
    """(call, event argument, levels -- None when not literal --, logger expression)."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        called = _level_calls(node.func)
        if called is not None:
            levels = {LEVEL_OF_METHOD.get(a.attr, a.attr) for a in called}
            yield node, node.args[0], levels, called[0].value
        elif (isinstance(node.func, ast.Attribute) and node.func.attr == "log"
              and len(node.args) >= 3):  # LimitedLog.log(logger, level, event, ...)
            level = _literals(node.args[1])
            yield node, node.args[2], None if level is None else set(level), node.args[0]


@cache
def scan_code() -> tuple[dict[str, Logged], list[str], list[str]]:
    """Every event the package logs; the non-literal call sites; the logger names used."""
    events: dict[str, Logged] = {}
    dynamic: list[str] = []
    logger_names: list[str] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        tree = ast.parse(path.read_text(), rel)
        module_loggers = _module_loggers(tree)
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "get_logger" and node.args):
                logger_names.append(ast.unparse(node.args[0]))
        for call, event_arg, levels, logger in _log_calls(tree):
            names = _literals(event_arg)
            if names is None:
                dynamic.append(f"{rel}:{call.lineno}")
                continue
            module_logger = (module_loggers.get(logger.id) if isinstance(logger, ast.Name)
                             else None)
            for name in names:
                entry = events.setdefault(name, Logged())
                entry.levels |= levels if levels is not None else {"any"}
                entry.loggers.add(module_logger)
                entry.sites.append(f"{rel}:{call.lineno}")
    for rel, dynamic_events in DYNAMIC_EVENTS.items():
        for name, levels in dynamic_events.items():
            entry = events.setdefault(name, Logged())
            entry.levels |= levels
            entry.sites.append(rel)
    return events, dynamic, logger_names


def read_table() -> dict[str, Row]:
    """The rows of the *Log events* table: ``| `event` | `logger` | levels | when | fields |``."""
    text = TABLE_DOC.read_text()
    start = text.index(f"\n{TABLE_HEADING}\n")
    end = text.find("\n## ", start + 1)
    rows: dict[str, Row] = {}
    for line in text[start:end if end != -1 else len(text)].splitlines():
        if not line.startswith("| `"):
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        event, logger, levels = (c.strip("`") for c in cells[:3])
        assert event not in rows, f"{event} has two rows"
        rows[event] = Row(event, {lg.strip().strip("`") for lg in logger.split(",")},
                          {lv.strip() for lv in levels.split(",")})
    return rows


def test_every_event_in_the_code_has_its_row_and_every_row_is_logged() -> None:
    events, _, _ = scan_code()
    rows = read_table()
    missing = {e: logged.sites for e, logged in events.items() if e not in rows}
    assert not missing, f"events without a row in {TABLE_DOC.name}'s table: {missing}"
    assert not rows.keys() - events.keys(), f"rows no code logs: {sorted(rows.keys() - events)}"


def test_each_row_says_the_level_and_logger_the_code_uses() -> None:
    events, _, _ = scan_code()
    rows = read_table()
    for name, logged in events.items():
        row = rows.get(name)
        if row is None:
            continue  # the test above names it
        assert row.levels == logged.levels, (name, row.levels, logged.levels, logged.sites)
        expected = ({LOGGER_OVERRIDDEN[name]} if name in LOGGER_OVERRIDDEN
                    else logged.loggers - {None})
        assert expected <= row.loggers, (name, row.loggers, expected, logged.sites)


def test_every_event_is_a_literal_so_none_escapes_the_table() -> None:
    _, dynamic, _ = scan_code()
    assert {site.split(":")[0] for site in dynamic} <= DYNAMIC_EVENTS.keys(), dynamic


def test_event_names_keep_one_rule() -> None:
    events, _, _ = scan_code()
    for name in events:
        assert EVENT_SHAPE.fullmatch(name), f"{name}: <subject>_<what happened>, snake case"
        verb = name.removesuffix(next((p for p in PARTICLES if name.endswith(p)), ""))
        assert (name.endswith(STATE_ENDINGS) or verb.endswith(IRREGULAR_ENDINGS)
                or verb.rsplit("_", 1)[1].endswith(("ed", "ing"))), (
            f"{name}: a past participle or a state, not a bare verb or noun "
            f"({events[name].sites})")


def test_loggers_are_named_by_component() -> None:
    _, _, names = scan_code()
    for name in names:
        literal = name.strip("\"'")
        assert name != literal and LOGGER_SHAPE.fullmatch(literal), (
            f"get_logger({name}): a literal cuzkd.<component>, never a module path")
