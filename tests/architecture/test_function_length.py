"""No function in src/ is longer than 60 lines (the house's limit; the median is 5): a longer
one does several things that each deserve a name."""

from __future__ import annotations

import ast

from tests.architecture.imports import PACKAGE_DIR, ROOT

LIMIT = 60


def long_functions(source: str) -> list[tuple[str, int, int]]:
    """(name, first line, length) of every function or method over the limit, nested ones too."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > LIMIT:
                found.append((node.name, node.lineno, length))
    return found


def test_no_function_in_src_is_over_the_limit() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}:{line} {name} ({length} lines)"
        for path in sorted(PACKAGE_DIR.rglob("*.py"))
        for name, line, length in long_functions(path.read_text())
    ]
    assert offenders == []


def test_the_measure_counts_decorators_out_and_bodies_in() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(LIMIT))
    assert long_functions(f"def short():\n{body[: body.rfind(chr(10))]}\n") == []
    assert long_functions(f"def long():\n{body}\n") == [("long", 1, LIMIT + 1)]
