"""`modelpool cache ls|rm`: what modelpool keeps on disk (converted and assembled models in
its work dir, the Hugging Face cache entries of the catalog's models), and freeing it.

`rm` deletes only entries `ls` lists (nothing outside the work dir's model kinds or the hub
cache), and refuses an entry that a model loaded on a running server uses (the server at
--url / MODELPOOL_URL is asked; `--force` removes anyway — the files are open by the engine,
the disk space comes back when it unloads). When no server answers it says so."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import httpx
import typer

from modelpool.cli.cache_entries import entries_of_model, list_entries, remove
from modelpool.cli.output import echo_err
from modelpool.client import AdminClient, ClientError
from modelpool.client.admin import DEFAULT_URL
from modelpool.config import load_config
from modelpool.config.schema import Config
from modelpool.errors import ConfigError, ModelSourceError

app = typer.Typer(help="List and free what modelpool keeps on disk.", no_args_is_help=True)
ConfigOpt = Annotated[Path | None, typer.Option("--config", "-c", help="YAML config file.", dir_okay=False)]
UrlOpt = Annotated[str, typer.Option("--url", envvar="MODELPOOL_URL", help="A running server to ask what is loaded.")]
KeyOpt = Annotated[
    str | None, typer.Option("--api-key", envvar="MODELPOOL_API_KEY", help="Its admin key.", show_default=False)
]
BUSY = {"ready", "loading", "downloading", "unloading"}
MAX_ENTRIES = 64


@app.command("ls")
def ls(
    config: ConfigOpt = None,
    every_repo: Annotated[
        bool, typer.Option("--all", help="Every repo in the hub cache, not only the catalog's.")
    ] = False,
) -> None:
    """List the work dir's entries and the hub cache's, with sizes and the models using each."""
    entries = list_entries(_config(config), every_repo=every_repo)
    rows = [("ENTRY", "SIZE", "USED BY")] + [
        (e.name, _size(e.size_bytes), ", ".join(e.used_by) or "-") for e in entries
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    for row in rows:
        typer.echo("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    typer.echo(f"\n{len(entries)} entries, {_size(sum(e.size_bytes for e in entries))}")


@app.command("rm")
def rm(
    entries: Annotated[list[str] | None, typer.Argument(help="Entries as `cache ls` names them.")] = None,
    model: Annotated[str | None, typer.Option("--model", help="Every entry this model uses.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Remove even what a loaded model uses.")] = False,
    config: ConfigOpt = None,
    url: UrlOpt = DEFAULT_URL,
    api_key: KeyOpt = None,
) -> None:
    """Remove cache entries (by name, or every one a model uses)."""
    settings = _config(config)
    names = list(entries or [])
    if model is not None:
        if model not in settings.models:
            echo_err(f"error: no model '{model}' in the catalog")
            raise typer.Exit(2)
        names += [e.name for e in entries_of_model(settings, model)]
    if not names or len(names) > MAX_ENTRIES:
        echo_err(f"error: name 1 to {MAX_ENTRIES} entries (or --model ID)")
        raise typer.Exit(2)
    if not force:
        _refuse_loaded(settings, names, url, api_key)
    for name in dict.fromkeys(names):
        try:
            gone = remove(settings, name)
        except ModelSourceError as exc:
            echo_err(f"error: {exc.message}")
            raise typer.Exit(1) from None
        typer.echo(f"removed {gone.name} ({_size(gone.size_bytes)}, {gone.path})")


def _refuse_loaded(config: Config, names: list[str], url: str, api_key: str | None) -> None:
    loaded = _loaded_models(url, api_key)
    if loaded is None:
        typer.echo(f"note: no server answered at {url}; not checked for loaded models", err=True)
        return
    users = {e.name: e.used_by for e in list_entries(config, every_repo=True)}
    busy = {name: sorted(set(users.get(name, ())) & loaded) for name in names}
    if blocked := {name: ids for name, ids in busy.items() if ids}:
        for name, ids in blocked.items():
            echo_err(
                f"refused: {name} is used by {', '.join(ids)}, loaded at {url} (`modelpool unload ID`, or --force)"
            )
        raise typer.Exit(1)


def _loaded_models(url: str, api_key: str | None) -> set[str] | None:
    """Ids of the models a running server has loaded (or is loading); None when none answers."""
    try:
        with AdminClient(url, api_key, timeout_s=3) as client:
            return {m["id"] for m in client.models() if m.get("state") in BUSY}
    except (ClientError, httpx.HTTPError):
        return None


def _config(path: Path | None) -> Config:
    try:
        return load_config(path, cli={})
    except ConfigError as exc:
        echo_err(f"error: {exc.message}")
        raise typer.Exit(2) from None


def _size(size_bytes: int) -> str:
    size = float(size_bytes)
    for unit in ("B", "KiB", "MiB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"
