"""`modelpool up / down / status / logs`: a stack of services, and the registry of what runs."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from modelpool.client.credentials import KeyEnvironment
from modelpool.client.errors import ConfigError as ClientConfigError
from modelpool.errors import ConfigError
from modelpool.services.by_port import stop_unregistered
from modelpool.services.control import find_log, follow, resolve, started, stop_services
from modelpool.services.launcher import FAILED, SKIPPED, Launcher, Outcome
from modelpool.services.process import answers_health, file_tail
from modelpool.services.registry import ENGINE_KIND, Registry, ServiceRecord
from modelpool.services.stack import DEFAULT_STACK_FILE, Stack, load_stack

T = TypeVar("T")
# Not a terminal (a log, a pipe): wide enough that ids and URLs are never cut.
console = Console(highlight=False, width=None if sys.stdout.isatty() else 200)
StateDirOpt = Annotated[
    Path | None,
    typer.Option(
        "--state-dir",
        envvar="MODELPOOL_STATE_DIR",
        help="Where the service registry and logs live (default: $XDG_STATE_HOME/modelpool).",
        show_default=False,
    ),
]
StackArg = Annotated[
    Path,
    typer.Argument(envvar="MODELPOOL_STACK", help="Stack file.", dir_okay=False, show_default=True),
]


def up(
    stack_file: StackArg = Path(DEFAULT_STACK_FILE),
    service: Annotated[
        list[str] | None, typer.Option("--service", "-s", help="Only this service (and what it depends on).")
    ] = None,
    detach: Annotated[
        bool, typer.Option("--detach", "-d", help="Leave every service running and return at once.")
    ] = False,
    model_backend: Annotated[
        str | None,
        typer.Option("--model-backend", help="Where the models run (`local`, `nim`): overrides the stack's."),
    ] = None,
    state_dir: StateDirOpt = None,
) -> None:
    """Start a stack of services (running ones are reused).

    Dependencies first, each waited for until healthy. In the foreground (the default),
    Ctrl-C stops the services it started except the persistent ones; with --detach
    everything keeps running until `modelpool down`. Every service gets the `.env` beside
    the stack file and, of the saved credentials, only the keys the model backend's
    `credentials:` list names (never over a variable already set)."""
    stack = _or_exit(lambda: load_stack(stack_file, model_backend))
    extra_env = _or_exit(lambda: _service_environment(stack))
    for name in stack.replaced:
        console.print(f"[bold]{name}[/]: not started: model_backend {stack.model_backend} replaces it")
    launcher = Launcher(stack, Registry(state_dir), detach=detach, on_event=_print_event, extra_env=extra_env)
    raise typer.Exit(asyncio.run(_up(launcher, service or None)))


def _service_environment(stack: Stack) -> dict[str, str]:
    """The stack's `.env` and the keys its model backend lists (`credentials:`), for its
    services, without what the process environment already sets (that reaches them anyway,
    and wins). Least privilege: a saved key the stack does not list stays out of every
    service's environment. Refuses to go on without a listed key, naming it (never a value)."""
    keys = KeyEnvironment(stack.file.parent)
    missing = [name for name in stack.credentials if not keys.get(name)]
    if missing:
        names = ", ".join(missing)
        raise ConfigError(
            f"model_backend {stack.model_backend} needs {names}: export it, put it in {stack.file.parent / '.env'}, "
            f"or save it with `modelpool credentials set {missing[0]}`"
        )
    passed = {**keys.dotenv(), **{name: keys[name] for name in stack.credentials}}
    return {name: value for name, value in passed.items() if name not in os.environ}


async def _up(launcher: Launcher, names: list[str] | None) -> int:
    try:
        outcomes = await launcher.up(names)
    except ConfigError as exc:
        console.print(f"[red]error:[/] {exc.message}")
        await launcher.stop_started()
        return 2
    _print_outcomes(launcher.stack, outcomes)
    failed = [o for o in outcomes if o.state in (FAILED, SKIPPED)]
    if launcher.detach:
        return 1 if failed else 0
    if failed:
        stopped = await launcher.stop_started()
        if stopped:
            console.print(f"stopped {', '.join(stopped)} (a service failed)")
        await launcher.detach_all()
        return 1
    if not launcher.started:
        console.print("Every service was already running; nothing to watch.")
        return 0
    return await _watch(launcher)


async def _watch(launcher: Launcher) -> int:
    """Until Ctrl-C/SIGTERM, or until every service it started has exited; 1 if one crashed."""
    persistent = [n for n in launcher.started if launcher.stack.services[n].spec.persistent]
    note = f" except the persistent ones ({', '.join(persistent)})" if persistent else ""
    console.print(f"Watching {len(launcher.started)} service(s). Ctrl-C stops them{note}.")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    while not stop.is_set() and launcher.started:
        await asyncio.wait([asyncio.create_task(stop.wait())], timeout=0.5)
    if not launcher.started:
        console.print("Every service this launcher started has exited.")
        return 1 if launcher.crashed else 0
    stopped = await launcher.stop_started()
    await launcher.detach_all()
    kept = f"; left running {', '.join(persistent)}" if persistent else ""
    console.print(f"stopped {', '.join(stopped) or 'nothing'}{kept}")
    return 1 if launcher.crashed else 0


def down(
    targets: Annotated[
        list[str] | None, typer.Argument(help="Service ids or names, or :PORT.", show_default=False)
    ] = None,
    ports: Annotated[
        list[int] | None,
        typer.Option(
            "--port", "-p", min=1, max=65535, help="The server on this port (see docs/stacks.md).", show_default=False
        ),
    ] = None,
    all_services: Annotated[bool, typer.Option("--all", help="Every running stack service.")] = False,
    stack_file: Annotated[
        Path | None,
        typer.Option("--stack", envvar="MODELPOOL_STACK", help=f"The stack to stop (default: ./{DEFAULT_STACK_FILE})."),
    ] = None,
    grace: Annotated[
        float | None, typer.Option(help="Seconds between SIGTERM and SIGKILL (default: each service's stop_grace_s).")
    ] = None,
    state_dir: StateDirOpt = None,
) -> None:
    """Stop services (by id or name; without names: the stack's), or servers by port.

    SIGTERM to each process group, SIGKILL after the grace period, dependents first.
    What is not running is skipped. By port (`--port 8107` or `:8107`): the registered
    service there, else the listening process if it is a modelpool or engine server of
    this user that answers HTTP there; anything else is left running (exit status 1)."""
    registry = Registry(state_dir)
    by_port = [*(ports or []), *(_port_of(t) for t in targets or [] if t.startswith(":"))]
    targets = [t for t in targets or [] if not t.startswith(":")]
    if by_port and (targets or all_services):
        console.print("[red]error:[/] stop by port, or by name / --all, not both at once")
        raise typer.Exit(2)
    if by_port:
        raise typer.Exit(asyncio.run(_stop_ports(registry, by_port, grace)))
    records: list[ServiceRecord] = []
    if all_services:
        records = [r for r in registry.records() if r.kind != ENGINE_KIND]
    elif targets:
        for target in targets:
            record = _or_exit(functools.partial(resolve, registry, target))
            if record is None:
                console.print(f"{target}: not running")
            elif record not in records:
                records.append(record)
    else:
        if stack_file is None and not Path(DEFAULT_STACK_FILE).is_file():
            console.print(f"[red]error:[/] no ./{DEFAULT_STACK_FILE} here: name services, or use --all or --stack FILE")
            raise typer.Exit(2)
        stack = _or_exit(lambda: load_stack(stack_file or Path(DEFAULT_STACK_FILE)))
        records = _stack_records(registry, stack)
        if not records:
            console.print(f"nothing of stack {stack.name!r} is running")

    def report(record: ServiceRecord, outcome: str) -> None:
        console.print(f"{record.id}\tpid {record.pid}\t{outcome}")

    asyncio.run(stop_services(registry, records, grace, report))


def _port_of(target: str) -> int:
    if not target[1:].isdigit() or not 1 <= int(target[1:]) <= 65535:
        console.print(f"[red]error:[/] {target[:20]!r} is not :PORT (1-65535)")
        raise typer.Exit(2)
    return int(target[1:])


async def _stop_ports(registry: Registry, ports: list[int], grace: float | None) -> int:
    """Each port's registered service, else its unregistered server (services/by_port.py)."""
    status = 0
    for port in dict.fromkeys(ports):
        records = [r for r in registry.records() if r.port == port and r.kind != ENGINE_KIND]
        if records:
            await stop_services(registry, records, grace, lambda r, o: console.print(f"{r.id}\tpid {r.pid}\t{o}"))
            continue
        result = await stop_unregistered(port, grace if grace is not None else 20.0)
        if result.outcome == "refused":
            console.print(f"port {port}: [yellow]left running[/]: {result.reason}")
            status = 1
        elif result.outcome == "nothing":
            console.print(f"port {port}: not running ({result.reason})")
        else:
            console.print(f"port {port}\tpid {result.pid}\t{result.outcome}")
    return status


def status(
    state_dir: StateDirOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="The registry entries as JSON, with health.")] = False,
) -> None:
    """List running services (stacks, persistent engines): URL, pid, health."""
    registry = Registry(state_dir)
    records = registry.records()
    healthy = asyncio.run(_probe_all(registry, records))
    if as_json:
        entries = [{**dataclasses.asdict(r), "healthy": ok} for r, ok in zip(records, healthy, strict=True)]
        typer.echo(json.dumps(entries, indent=2))
        return
    if not records:
        console.print("no services are running")
        return
    table = Table("ID", "NAME", "KIND", "STACK", "URL", "PID", "HEALTH", "STARTED")
    for record, ok in zip(records, healthy, strict=True):
        health = "[green]healthy[/]" if ok else "[yellow]not answering[/]"
        cells = [record.id, record.name, record.kind, record.stack or "-", record.url, str(record.pid)]
        table.add_row(*cells, health, started(record))
    console.print(table)


def logs(
    target: Annotated[str, typer.Argument(help="Service id or name.")],
    follow_output: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing until it exits.")] = False,
    lines: Annotated[int, typer.Option("--lines", "-n", help="How many of the last lines.")] = 100,
    state_dir: StateDirOpt = None,
) -> None:
    """Print a service's log (a stopped service's last log too); -f follows it."""
    path, record = _or_exit(lambda: find_log(Registry(state_dir), target))
    for line in file_tail(path, lines) if path.exists() else []:
        typer.echo(line)
    if follow_output and record is not None:
        try:
            for line in follow(path, record):
                typer.echo(line)
        except KeyboardInterrupt:
            return


def _stack_records(registry: Registry, stack: Stack) -> list[ServiceRecord]:
    return [r for r in registry.records() if r.extra.get("stack_file") == str(stack.file)]


async def _probe_all(registry: Registry, records: list[ServiceRecord]) -> list[bool]:
    """Each one's health, asked with its key when it demands one (a persistent engine)."""
    probes = (answers_health(r.url + r.health_path, registry.key(r.id)) for r in records)
    return list(await asyncio.gather(*probes))


def _print_event(name: str, message: str) -> None:
    console.print(f"[bold]{name}[/]: {message}")


def _print_outcomes(stack: Stack, outcomes: list[Outcome]) -> None:
    table = Table("SERVICE", "STATE", "URL", "PID", "TIME", title=f"stack {stack.name}", title_justify="left")
    colours = {"started": "green", "reused": "cyan", "failed": "red", "skipped": "yellow"}
    for outcome in outcomes:
        record = outcome.record
        table.add_row(
            outcome.service.name,
            f"[{colours[outcome.state]}]{outcome.state}[/]",
            record.url if record else "-",
            str(record.pid) if record else "-",
            f"{outcome.seconds:.1f}s",
        )
    console.print(table)
    for outcome in outcomes:
        if outcome.state == FAILED:
            console.print(f"[red]{outcome.service.name} failed:[/] {outcome.error}")


def _or_exit(call: Callable[[], T]) -> T:
    try:
        return call()
    except (ConfigError, ClientConfigError) as exc:
        console.print(f"[red]error:[/] {exc.message}")
        raise typer.Exit(2) from None
