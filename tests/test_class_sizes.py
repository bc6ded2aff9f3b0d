"""No class in ``cuzkd/`` is both wide and deep: a newcomer can hold one class in their head.

A class with more than :data:`MAX_METHODS` methods *and* more than :data:`MAX_ATTRIBUTES`
attributes has had several jobs piled into it (the engine runner once had 46 and 43); one that
is large on one axis only, a wide table of queries or a record of many fields, says why in its
docstring. Counted from the source, as a reader counts: ``def``s in the class body, and the
distinct ``self.X`` assigned anywhere in it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "cuzkd"
MAX_METHODS = 25
MAX_ATTRIBUTES = 20


def class_sizes(source: str) -> dict[str, tuple[int, int]]:
    """Each class in ``source``, by name: (methods, attributes)."""
    sizes: dict[str, tuple[int, int]] = {}
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ClassDef):
            continue
        methods = sum(isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
                      for item in node.body)
        attributes = {target.attr for target in ast.walk(node)
                      if isinstance(target, ast.Attribute) and isinstance(target.ctx, ast.Store)
                      and isinstance(target.value, ast.Name) and target.value.id == "self"}
        sizes[node.name] = (methods, len(attributes))
    return sizes


def too_big(sizes: dict[str, tuple[int, int]]) -> list[str]:
    return [f"{name}: {methods} methods, {attributes} attributes"
            for name, (methods, attributes) in sizes.items()
            if methods > MAX_METHODS and attributes > MAX_ATTRIBUTES]


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")),
                         ids=lambda path: str(path.relative_to(PACKAGE)))
def test_no_class_has_many_methods_and_many_attributes(path: Path) -> None:
    assert too_big(class_sizes(path.read_text())) == []


def test_a_class_with_many_methods_and_attributes_is_found() -> None:
    body = "".join(f"    def m{i}(self) -> None:\n        self.a{i} = {i}\n"
                   for i in range(MAX_METHODS + 1))
    assert too_big(class_sizes(f"class Big:\n{body}")) == [
        f"Big: {MAX_METHODS + 1} methods, {MAX_METHODS + 1} attributes"]
    # wide on one axis only is allowed
    wide = "".join(f"    def m{i}(self) -> None: ...\n" for i in range(MAX_METHODS + 1))
    assert too_big(class_sizes(f"class Wide:\n{wide}")) == []
