"""`modelpool ps / load / unload`: talk to a running server through the client SDK."""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer
import yaml
from rich.console import Console
from rich.table import Table

from modelpool.cli.stack import StateDirOpt, status
from modelpool.client import AdminClient, ClientError
from modelpool.client.admin import DEFAULT_URL

# Not a terminal (a pipe, a log): wide enough that ids are never wrapped.
console = Console(highlight=False, width=None if sys.stdout.isatty() else 200)
UrlOpt = Annotated[str, typer.Option("--url", envvar="MODELPOOL_URL", help="Server to talk to.")]
KeyOpt = Annotated[
    str | None, typer.Option("--api-key", envvar="MODELPOOL_API_KEY", help="Admin API key.", show_default=False)
]


def ps(
    url: UrlOpt = DEFAULT_URL,
    api_key: KeyOpt = None,
    services: Annotated[
        bool, typer.Option("--services", help="List running services (stacks, persistent engines): status --stacks.")
    ] = False,
    state_dir: StateDirOpt = None,
) -> None:
    """Show every model of a running server: state, replicas, work, memory, expiry
    (`status` adds the server itself: its URL, version and memory)."""
    if services:
        status(state_dir, as_json=False)
        return
    with _client(url, api_key) as client:
        models = or_exit(client.models)
    console.print(models_table(models))


def models_table(models: list[dict[str, Any]]) -> Table:
    """Each model of a server, one row: what `ps` prints and `status` ends with."""
    table = Table("MODEL", "STATE", "REPLICAS", "RUNNING", "QUEUED", "MEMORY", "EXPIRES IN", "LAST ERROR")
    for m in models:
        table.add_row(
            m["id"],
            state_text(m),
            f"{len(m['replicas'])}/{m['replicas_wanted']}",
            str(m["in_flight"]),
            str(m["queued"]),
            mib(m["memory"]["counted_bytes"]),
            _expiry(m),
            (m["last_error"] or "")[:60],
        )
    return table


def load(
    model: Annotated[str, typer.Argument(help="Model id or alias.")],
    replicas: Annotated[int | None, typer.Option(help="Scale to this many replicas.")] = None,
    option: Annotated[list[str] | None, typer.Option("--set", help="Backend option override, KEY=VALUE.")] = None,
    url: UrlOpt = DEFAULT_URL,
    api_key: KeyOpt = None,
) -> None:
    """Load a model (or reload it with option overrides, or rescale it) and wait until ready."""
    overrides = dict(_parse_override(item) for item in option or [])
    with _client(url, api_key) as client, console.status(f"Loading {model}…"):
        result = or_exit(lambda: client.load(model, overrides=overrides, replicas=replicas))
    console.print(
        f"[green]{result['id']}[/] {result['state']} in {result['load_seconds'] or 0:.2f}s, "
        f"{len(result['replicas'])} replica(s), {mib(result['memory']['counted_bytes'])}"
    )


def unload(
    model: Annotated[str, typer.Argument(help="Model id or alias.")],
    force: Annotated[bool, typer.Option(help="Cut running requests off instead of waiting for them.")] = False,
    url: UrlOpt = DEFAULT_URL,
    api_key: KeyOpt = None,
) -> None:
    """Unload a model (waiting for its running requests unless --force)."""
    with _client(url, api_key) as client, console.status(f"Unloading {model}…"):
        result = or_exit(lambda: client.unload(model, drain=not force))
    console.print(f"[green]{result['id']}[/] {result['state']}")


def reload(url: UrlOpt = DEFAULT_URL, api_key: KeyOpt = None) -> None:
    """Re-read the server's config and apply the difference (as SIGHUP does); an invalid
    config changes nothing and exits 1 saying why."""
    with _client(url, api_key) as client, console.status("Reloading the config…"):
        diff = or_exit(client.reload)
    for label, key in (("added", "added"), ("removed", "removed"), ("applied live", "live"),
                       ("needs restart", "needs_restart")):  # fmt: skip
        if diff[key]:
            console.print(f"{label}: {', '.join(diff[key])}")
    for label, key in (("reloads when idle", "reloading"), ("changed at once", "hot")):
        for change in diff[key]:
            console.print(f"{label}: {change['id']} ({', '.join(change['fields'])})")
    console.print(f"[green]config reloaded[/], {diff['unchanged']} model(s) unchanged")


def _client(url: str, api_key: str | None) -> AdminClient:
    return AdminClient(url, api_key)


def or_exit(call: Any) -> Any:
    try:
        return call()
    except ClientError as exc:
        console.print(f"[red]error:[/] {exc.message}")
        raise typer.Exit(1) from None


def _parse_override(item: str) -> tuple[str, Any]:
    key, sep, value = item.partition("=")
    if not sep or not key:
        raise typer.BadParameter(f"'{item}' is not KEY=VALUE", param_hint="--set")
    return key.strip(), yaml.safe_load(value)


def mib(value: int | None) -> str:
    return "-" if not value else f"{value / 1024 / 1024:.0f} MiB"


def state_text(model: dict[str, Any]) -> str:
    """The state, with how far a download is (`downloading 42% of 270 MiB`)."""
    download = model.get("download")
    if model["state"] != "downloading" or not isinstance(download, dict):
        return str(model["state"])
    return f"downloading {download.get('percent', 0):.0f}% of {mib(download.get('total_bytes'))}"


def _expiry(model: dict[str, Any]) -> str:
    if model["state"] != "ready":
        return "-"
    return "never" if model["expires_in_s"] is None else f"{model['expires_in_s']:.0f}s"
