"""`modelpool status`: the running server at a glance; `--stacks`: the services modelpool runs.

Why the server by default: "is it up, which one, what is loaded, how much memory" is the
question after `serve` and before `run`, as `ollama ps` answers it; the stacks are a
second, rarer question (`up`/`down` users), kept one flag away. `ps` is the same models
table without the header (and `ps --services` the same stacks list).
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Annotated, Any

import typer

from modelpool.cli import stack
from modelpool.cli.admin import KeyOpt, UrlOpt, console, mib, models_table, or_exit
from modelpool.client import AdminClient
from modelpool.client.admin import DEFAULT_URL


def status(
    url: UrlOpt = DEFAULT_URL,
    api_key: KeyOpt = None,
    stacks: Annotated[
        bool, typer.Option("--stacks", help="List the running services (stacks, persistent engines) instead.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Everything shown, as JSON.")] = False,
    state_dir: stack.StateDirOpt = None,
) -> None:
    """Show the running server: its URL and version, memory, and each model's state and work."""
    if stacks:
        stack.status(state_dir, as_json=as_json)
        return
    with AdminClient(url, api_key, timeout_s=30) as client:
        health = or_exit(client.health)
        models = or_exit(client.models)
        memory = or_exit(client.memory)
    if as_json:
        typer.echo(json.dumps({"url": url, "version": health.get("version"), "memory": memory, "models": models}))
        return
    for label, text in summary(url, health, memory, models):
        typer.echo(f"{label:<8} {text}")  # not rich: a line is never wrapped to the terminal
    console.print(models_table(models))


def summary(
    url: str, health: dict[str, Any], memory: dict[str, Any], models: list[dict[str, Any]]
) -> list[tuple[str, str]]:
    """The header lines: which server, how its memory stands, what its models do."""
    states = Counter(m["state"] for m in models)
    running, queued = sum(m["in_flight"] for m in models), sum(m["queued"] for m in models)
    by_state = ", ".join(f"{count} {state}" for state, count in sorted(states.items()))
    return [
        ("server", f"{url.rstrip('/')}  (modelpool {health.get('version', '?')})"),
        ("memory", _memory_line(memory)),
        ("models", f"{len(models)}: {by_state or 'none'}; {running} running, {queued} queued"),
    ]


def _memory_line(memory: dict[str, Any]) -> str:
    system = memory.get("system") or {}
    budget = (memory.get("budget") or {}).get("memory_bytes")
    counted = sum((m.get("memory_bytes") or 0) for m in (memory.get("models") or {}).values())
    parts = [
        f"process {mib(system.get('process_rss_bytes'))}",
        f"models {mib(counted)} (budget: {mib(budget) if budget else 'unlimited'})",
        f"machine {mib(system.get('available_bytes'))} free of {mib(system.get('total_bytes'))}",
    ]
    return ", ".join(parts)
