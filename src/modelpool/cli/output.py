"""Terminal output of the CLI (tables, errors)."""

from __future__ import annotations

import typer

from modelpool.backends.registry import model_capabilities
from modelpool.config.schema import Config
from modelpool.config.sources import HubLocation, is_source_available, model_sources
from modelpool.errors import ConfigError


def echo_err(message: str) -> None:
    typer.secho(message, err=True, fg=typer.colors.RED)


def print_models_table(config: Config) -> None:
    hub = HubLocation(config.hf_cache_dir, offline=True)
    served = {m.id for m in config.served_models()}
    rows = [("ID", "TASKS", "BACKEND", "SERVED", "INSTALLED", "SOURCE")]
    hints = []
    for model in config.models.values():
        try:
            tasks = ",".join(sorted(t.value for t in model_capabilities(model).tasks))
        except ConfigError as exc:
            tasks = f"error: {exc.message}"
        installed = all(is_source_available(source, hub=hub, backend=model.backend) for source in model_sources(model))
        if not installed and model.install_hint:
            hints.append(f"  {model.id}: {model.install_hint}")
        rows.append((model.id, tasks, model.backend, _yes(model.id in served), _yes(installed), model.source or "-"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        typer.echo("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False)).rstrip())
    if hints:
        typer.echo("\nNot installed; to install:")
        typer.echo("\n".join(hints))


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"
