"""The layer rules of docs/architecture.md, held by the code itself: each unit of the package
(a subpackage or top-level module of `modelpool`) may import only the units its row allows,
and no two units import each other, directly or round a longer loop.

This is import-linter's "layers" and "independence" contracts written as a plain test (no
extra dependency to lock): an allowlist per unit, so a new import across layers fails here
until someone decides — in this table, in review — that the layer may know that one."""

from __future__ import annotations

import pytest

from tests.architecture.imports import Import, all_imports, all_modules, existing_units, module_of, unit_of

# Data and small pure helpers every layer shares; they import only each other.
SHARED = frozenset(
    {
        "modelpool",  # the package root: only `__version__`
        "built_once",  # a cache folder built once, safe across threads and processes
        "capabilities",
        "config",
        "errors",
        "extras",  # which optional feature needs which pip extra, asked before the import
        "inference",
        "logs",
        "offload",
        "owner",  # who a stored thing belongs to, and who is calling
        "quiet_warnings",  # a warning silenced around one call, safe across threads
        "tasks",
        "tracing",
    }
)
# Libraries below the engines and the protocols: audio codecs, images, tool-call parsing.
LIBRARIES = frozenset({"audio", "media", "tools"})
# The narrow pool interface and every type that crosses it (results, streams, usage, status
# snapshots): what the routes, the MCP tools and the protocols know of the pool.
INTERFACE = frozenset({"pool_api", "status"})
BASE = SHARED | LIBRARIES | INTERFACE

# unit -> the units it may import (besides itself). Read a row as "X knows only these".
ALLOWED: dict[str, frozenset[str]] = {
    **{unit: SHARED for unit in SHARED},
    # The settings resolve `hf:` sources through `hub` and fill in what an entry leaves out
    # (its backend, tasks) through `detect`; neither of them knows the settings.
    "config": SHARED | {"hub", "detect"},
    # Hugging Face references, file selection, downloads, the cache: only `errors` below them.
    "hub": SHARED,
    # What a model is, from its files (a folder, a GGUF header, a hub repo seen as files).
    "detect": SHARED,
    **{unit: SHARED | LIBRARIES for unit in LIBRARIES},
    **{unit: BASE for unit in INTERFACE},
    "services": SHARED,
    # The protocols: OpenAI and Anthropic shapes <-> the pool's requests and results.
    "wire": BASE,
    # Engines. The remote backend speaks OpenAI to its upstream through `wire`; managed
    # engines supervise their process through `services`; GGUF engines size their KV cache
    # from the header `detect` parses.
    "backends": BASE | {"wire", "services", "detect"},
    # The pool's implementation. It never knows a protocol, a route or the app.
    "runtime": BASE | {"backends", "services"},
    # The leaves the root assembles: they know the pool only through `pool_api`.
    "api": BASE | {"wire"},
    "mcp_server": BASE | {"wire"},
    "ui": frozenset(),
    # The one root where the app is assembled.
    "server": BASE | {"wire", "api", "mcp_server", "ui", "runtime", "backends", "services"},
    # Ray Serve: builds pools in its replicas and the app at its ingress.
    "ray_serve": BASE | {"wire", "server", "runtime", "backends", "services"},
    # The SDK could ship as a package of its own: it knows nothing of the server.
    "client": frozenset(),
    # The load generator (`modelpool bench`, benchmarks/): HTTP to any OpenAI-compatible URL,
    # so like the SDK it knows nothing of the server it measures.
    "loadgen": frozenset(),
    # Commands: server-side verbs build the app, the rest go through the SDK.
    "cli": BASE
    | {"wire", "api", "server", "runtime", "backends", "services", "client", "ray_serve", "hub", "detect", "loadgen"},
    "__main__": frozenset({"cli"}),
}

IMPORTS = all_imports()


def test_every_unit_has_a_row() -> None:
    """A new subpackage or top-level module must take its place in the table."""
    assert existing_units() - set(ALLOWED) == set()


@pytest.mark.parametrize("unit", sorted(ALLOWED))
def test_unit_imports_only_what_its_layer_allows(unit: str) -> None:
    crossings = [
        found.where()
        for found in IMPORTS
        if unit_of(found.importer) == unit
        and unit_of(found.imported) != unit
        and unit_of(found.imported) not in ALLOWED[unit]
    ]
    assert crossings == []


def unit_graph(imports: list[Import]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for found in imports:
        source, target = unit_of(found.importer), unit_of(found.imported)
        if source != target and target != "modelpool":
            graph.setdefault(source, set()).add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one unit (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for succ in graph.get(node, set()):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_package_graph_has_no_cycle() -> None:
    assert cycles(unit_graph(IMPORTS)) == []


def test_cycle_finder_finds_a_loop() -> None:
    """The finder itself can fail: a three-unit loop is found, a chain is not."""
    loop = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(loop) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": {"c"}}) == []


def test_no_module_imports_itself_round_a_loop_at_run_time() -> None:
    """Module by module, the imports that run (all but `if TYPE_CHECKING:` ones) form no
    loop: a loop makes a module's import order decide whether a name exists yet. A slot's
    helpers may name `ModelSlot` in annotations; they may not import it to run."""
    modules = all_modules()
    graph: dict[str, set[str]] = {}
    for found in IMPORTS:
        if not found.type_only:
            target = module_of(found.imported, modules)
            if target != found.importer:
                graph.setdefault(found.importer, set()).add(target)
    assert cycles(graph) == []
