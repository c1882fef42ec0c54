"""The import graph of `src/modelpool`, read from the source (ast, nothing imported): which
modelpool module imports which, at any depth — top level, inside functions, under
`TYPE_CHECKING` — since a lazy import is still a dependency of the layer that writes it."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE_DIR = ROOT / "src" / "modelpool"


@dataclass(frozen=True)
class Import:
    """One import statement: `importer` (a module) names `imported` (a module or a name in it)."""

    importer: str
    imported: str
    path: Path
    line: int
    type_only: bool = False
    """Under `if TYPE_CHECKING:`: a name for annotations, nothing run at import time."""

    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}: {self.importer} imports {self.imported}"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _absolute(node: ast.ImportFrom, importer: str, is_package: bool) -> str:
    if node.level == 0:
        return node.module or ""
    base = importer.split(".") if is_package else importer.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """ids of the nodes inside `if TYPE_CHECKING:` blocks."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for stmt in node.body:
                inside.update(id(child) for child in ast.walk(stmt))
    return inside


def imports_of(path: Path) -> Iterator[Import]:
    importer = module_name(path)
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text(), filename=str(path))
    type_only = _type_checking_nodes(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node, importer, is_package)
            names = [base]
            if base == "modelpool":  # `from modelpool import tracing` names a unit of its own
                names = [_root_member(alias.name) for alias in node.names]
        else:
            continue
        for name in names:
            if name == "modelpool" or name.startswith("modelpool."):
                yield Import(importer, name, path, node.lineno, id(node) in type_only)


def _root_member(name: str) -> str:
    return f"modelpool.{name}" if name in existing_units() else "modelpool"


def all_imports() -> list[Import]:
    return [found for path in sorted(PACKAGE_DIR.rglob("*.py")) for found in imports_of(path)]


def unit_of(module: str) -> str:
    """The layer unit a module belongs to: the first name under `modelpool` (a subpackage or a
    top-level module), or `modelpool` itself for the package's `__init__`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "modelpool"


def existing_units() -> set[str]:
    units = {p.name for p in PACKAGE_DIR.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    return units | {p.stem for p in PACKAGE_DIR.glob("*.py") if p.stem != "__init__"}


def all_modules() -> set[str]:
    return {module_name(path) for path in PACKAGE_DIR.rglob("*.py")}


def module_of(name: str, modules: set[str]) -> str:
    """The module an imported name lives in: itself when it is one, else its parent."""
    while name not in modules and "." in name:
        name = name.rsplit(".", 1)[0]
    return name
