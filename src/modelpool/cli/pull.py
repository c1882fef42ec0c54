"""`modelpool pull REF…`: download models from the Hugging Face hub into its cache, with a
progress bar per file and one for the total.

Which files: those the model's backend loads (`hub.select`), the backend detected from the
repo's files (`modelpool.detect` on a `HubView`: names, small JSON files, a GGUF header by
a ranged GET) unless `--backend` says. HF_TOKEN opens gated repos (never printed);
HF_ENDPOINT points at a mirror; HF_HUB_OFFLINE=1 only checks the cache."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from modelpool.cli.output import echo_err
from modelpool.config import load_config
from modelpool.config.detection import hub_selected
from modelpool.errors import ConfigError, ModelSourceError
from modelpool.hub.access import HubAccess
from modelpool.hub.pull import PullCancelled, PullPlan, PullProgress, plan_pull, pull
from modelpool.hub.reference import HubReference, parse_reference
from modelpool.hub.view import HubView

MAX_REFERENCES = 32
BackendOpt = Annotated[
    str | None, typer.Option("--backend", help="Take the files this backend loads (default: detected from the repo).")
]
ConfigOpt = Annotated[
    Path | None, typer.Option("--config", "-c", help="YAML config (for hf_cache_dir).", dir_okay=False)
]


def pull_command(
    references: Annotated[list[str], typer.Argument(help="hf:org/repo[@rev][:Q4_K_M|:file.gguf], or org/repo…")],
    backend: BackendOpt = None,
    config: ConfigOpt = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bars.")] = False,
) -> None:
    """Download models from the Hugging Face hub (only the files their backend needs)."""
    if len(references) > MAX_REFERENCES:
        echo_err(f"error: at most {MAX_REFERENCES} references at once")
        raise typer.Exit(2)
    access = _access(config)
    refs = [_reference(text) for text in references]
    for ref in refs:
        try:
            plan = _plan(ref, backend, access)
            path = _download(plan, access, quiet=quiet)
        except PullCancelled:
            echo_err(f"cancelled: {ref}")
            raise typer.Exit(130) from None
        except ModelSourceError as exc:
            echo_err(f"error: {exc.message}")
            raise typer.Exit(1) from None
        typer.echo(f"{ref} → {path}")


def _access(config: Path | None) -> HubAccess:
    try:
        settings = load_config(config, cli={})
    except ConfigError as exc:
        echo_err(f"error: {exc.message}")
        raise typer.Exit(2) from None
    return HubAccess.from_env(settings.hf_cache_dir, offline=settings.offline)


def _reference(text: str) -> HubReference:
    try:
        return parse_reference(text)
    except ModelSourceError as exc:
        echo_err(f"error: {exc.message}")
        raise typer.Exit(2) from None


def _plan(ref: HubReference, backend: str | None, access: HubAccess) -> PullPlan:
    if backend is None:
        from modelpool.detect import detect

        view = HubView(ref, access)
        found = detect(view, label=str(ref), selected=hub_selected(ref, view.names()))
        typer.echo(f"{ref}: {found.backend} ({found.reason})", err=True)
        return plan_pull(ref, found.backend, access)
    return plan_pull(ref, backend, access)


def _download(plan: PullPlan, access: HubAccess, *, quiet: bool) -> Path:
    missing = plan.missing(access)
    if not missing:
        return pull(plan, access)
    if quiet:
        return pull(plan, access)
    console = Console(stderr=True)
    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
               TimeRemainingColumn())  # fmt: skip
    with Progress(*columns, console=console, transient=False) as bars:
        tasks: dict[str, TaskID] = {
            name: bars.add_task(name, total=plan.listing.sizes.get(name, 0)) for name in missing
        }
        overall = bars.add_task(f"[bold]{plan.ref}", total=plan.total_bytes)

        def show(progress: PullProgress) -> None:
            for name, task in tasks.items():
                bars.update(task, completed=progress.files[name].done, total=progress.files[name].total or None)
            bars.update(overall, completed=progress.done_bytes, total=progress.total_bytes)

        try:
            return pull(plan, access, on_progress=show)
        except KeyboardInterrupt:
            raise PullCancelled(f"pulling {plan.ref} was interrupted") from None
