"""Every closed set of words in cuzkd is a ``StrEnum``, none a ``Literal``: one home per word,
one type the core compares members of (the issue "Code a newcomer can live in")."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "cuzkd"


def literal_uses(source: str) -> list[int]:
    """Lines of ``source`` that name ``Literal`` (imported, subscripted or as
    ``typing.Literal``)."""
    return sorted({node.lineno for node in ast.walk(ast.parse(source)) if _names_literal(node)})


def _names_literal(node: ast.AST) -> bool:
    if isinstance(node, ast.ImportFrom):
        return any(alias.name == "Literal" for alias in node.names)
    if isinstance(node, ast.Name):
        return node.id == "Literal"
    return isinstance(node, ast.Attribute) and node.attr == "Literal"


def test_the_scan_finds_a_literal_however_it_is_spelt() -> None:
    assert literal_uses("from typing import Literal\nX = Literal['a', 'b']\n") == [1, 2]
    assert literal_uses("import typing\nX = typing.Literal['a']\n") == [2]
    assert literal_uses("import enum\nclass X(enum.StrEnum):\n    A = 'a'\n") == []


def test_no_word_set_in_cuzkd_is_a_literal() -> None:
    found = {str(path.relative_to(PACKAGE.parent)): lines
             for path in sorted(PACKAGE.rglob("*.py"))
             if (lines := literal_uses(path.read_text()))}
    assert found == {}, "closed word sets are enum.StrEnum (see cuzkd/states.py)"
