"""The SDK stands alone: no module of `modelpool.client` imports anything of modelpool outside
it (at the top or inside a function), so it could ship as its own package."""

from __future__ import annotations

import ast
from pathlib import Path

import modelpool.client

PACKAGE = Path(modelpool.client.__file__).parent


def _imported(tree: ast.AST) -> list[str]:
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return names


def test_the_sdk_imports_nothing_of_modelpool_outside_it() -> None:
    modules = sorted(PACKAGE.glob("*.py"))
    assert len(modules) > 10  # the package itself was found
    outside = {
        f"{path.name}: {name}"
        for path in modules
        for name in _imported(ast.parse(path.read_text()))
        if (name == "modelpool" or name.startswith("modelpool.")) and not name.startswith("modelpool.client")
    }
    assert outside == set()
