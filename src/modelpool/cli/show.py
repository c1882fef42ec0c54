"""`modelpool show MODEL`: what a model is before serving it — a catalog id, a file or folder
on disk, or an `hf:` reference (`org/repo…` without the prefix too). Its source and files
with their sizes (for a hub repo: the files its backend would pull, and which are already
in the cache), the backend (configured, or detected and why), the tasks and capabilities
it would be served with, the detected facts (architecture, trained context, quantisation,
size) and every option the backend takes, with the value it would get.

Nothing is loaded and nothing big is downloaded: detection reads names, small JSON files
and a GGUF header (a ranged GET for a hub repo)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic_core import PydanticUndefined

from modelpool.backends.registry import backend_class, model_capabilities
from modelpool.cli.output import echo_err
from modelpool.cli.serve_sources import slug, source_of
from modelpool.config import load_config
from modelpool.config.detection import Inspection, completed_entry, inspect_source
from modelpool.config.schema import Config, ModelConfig
from modelpool.config.sources import HubLocation
from modelpool.errors import ConfigError, ModelSourceError
from modelpool.hub.listing import snapshot_folder
from modelpool.hub.reference import Selector
from modelpool.hub.select import files_for

MAX_FILES_SHOWN = 40
_SENTENCE_END = re.compile(r"(?<=[a-z0-9)])\. (?=[A-Z])")
ConfigOpt = Annotated[Path | None, typer.Option("--config", "-c", help="YAML config (its catalog).", dir_okay=False)]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")]


def show_command(
    model: Annotated[str, typer.Argument(help="A catalog id, a file or folder, or hf:org/repo[:Q4_K_M|:file][@rev].")],
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Show a model: files and size, backend, tasks and capabilities, detected facts, options."""
    try:
        settings = load_config(config, cli={})
        report = describe(model, settings)
    except (ConfigError, ModelSourceError) as exc:
        echo_err(f"error: {exc.message}")
        raise typer.Exit(1) from None
    typer.echo(json.dumps(report, indent=2) if as_json else render(report))


def describe(arg: str, config: Config) -> dict[str, Any]:
    """Everything `show` prints, as data."""
    hub = HubLocation(config.hf_cache_dir, offline=config.offline)
    entry = _catalog_entry(arg, config)
    if entry is not None:
        model, how = entry, "configured"
        inspection, problem = _inspect(model, hub)
    else:
        source, model_id = source_of(arg), slug(arg)
        inspection, problem = inspect_source(source, None, hub, model_id=model_id), None
        model = ModelConfig.model_validate({"id": model_id, **completed_entry(model_id, {"source": source}, hub)})
        how = "detected"
    detected = inspection.detected if inspection else None
    return {
        "id": model.id,
        "source": model.source,
        "backend": model.backend,
        "backend_from": how,
        "detected": {"backend": detected.backend, "reason": detected.reason, **detected.facts()} if detected else None,
        "detection_problem": problem,
        "capabilities": model_capabilities(model).as_json(),
        "files": _files(inspection, model) if inspection else [],
        "assembled": {name: len(parts) for name, parts in model.assemble.items()},
        "options": _options(model),
    }


def _catalog_entry(arg: str, config: Config) -> ModelConfig | None:
    """The catalog entry `arg` names by id or alias (a path on disk is never a catalog id)."""
    if Path(arg).expanduser().exists():
        return None
    return next((m for m in config.models.values() if arg == m.id or arg in m.aliases), None)


def _inspect(model: ModelConfig, hub: HubLocation) -> tuple[Inspection | None, str | None]:
    """A configured model's files as detection sees them; a source that is not here (or a
    layout detection does not know) is said, not fatal: the entry names its backend."""
    if model.source is None:
        return None, "no source (a remote model)"
    try:
        return inspect_source(model.source, model.assemble or None, hub, model_id=model.id), None
    except ModelSourceError as exc:
        return None, exc.message


def _files(inspection: Inspection, model: ModelConfig) -> list[dict[str, Any]]:
    """Each file: its name, size and whether it is on this machine."""
    if inspection.hub is not None:
        view = inspection.hub
        names = files_for(model.backend, view.names(), view.ref.selector)
        folder = snapshot_folder(view.access, view.listing)
        return [{"name": n, "bytes": view.size(n), "local": (folder / n).is_file()} for n in names]
    local = inspection.local
    if local is None:
        return []
    weights = local.selected or inspection.detected.weights
    try:  # the files the backend loads, as a pull from the hub would choose them
        names = files_for(model.backend, local.names(), Selector(filename=weights))
    except ModelSourceError:
        names = list(local.names())
    return [{"name": n, "bytes": _size(local.local_path(n)), "local": True} for n in names]


def _size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except OSError:  # a dangling link
        return None


def _options(model: ModelConfig) -> list[dict[str, Any]]:
    """Every option of the backend: the value this model gets, its default, what it means."""
    fields = backend_class(model.backend).Options.model_fields
    shown = []
    for name, field in fields.items():
        if field.default_factory is not None:
            default: Any = field.default_factory()  # type: ignore[call-arg]  # pydantic's factories here take no argument
        else:
            default = None if field.default is PydanticUndefined else field.default
        value = model.options.get(name, default)
        meaning = _SENTENCE_END.split(" ".join((field.description or "").split()), maxsplit=1)[0].rstrip(".")
        shown.append({"name": name, "value": _plain(value), "default": _plain(default),
                      "set": name in model.options, "meaning": meaning})  # fmt: skip
    return shown


def _plain(value: Any) -> Any:
    """A value JSON can carry (paths and enums as text)."""
    if value is None or isinstance(value, (bool, int, float, str, list, dict)):
        return value
    return str(value.value) if hasattr(value, "value") else str(value)


def render(report: dict[str, Any]) -> str:
    """The report as text for a terminal."""
    caps, detected = report["capabilities"], report["detected"] or {}
    lines = [report["id"], *_pairs(_summary(report, caps, detected))]
    lines += _file_lines(report["files"])
    lines.append(f"  options of {report['backend']} (* set for this model):")
    for option in report["options"]:
        mark = "*" if option["set"] else " "
        lines.append(f"   {mark} {option['name']} = {json.dumps(option['value'])}  — {option['meaning']}")
    return "\n".join(lines)


def _summary(report: dict[str, Any], caps: dict[str, Any], detected: dict[str, Any]) -> list[tuple[str, Any]]:
    how = report["backend_from"]
    reason = f" ({how}: {detected['reason']})" if detected.get("reason") and how == "detected" else f" ({how})"
    also = ""
    if how == "configured" and detected and detected.get("backend") != report["backend"]:
        also = f"; the files alone say {detected['backend']} ({detected['reason']})"
    return [
        ("source", report["source"] or "-"),
        ("backend", f"{report['backend']}{reason}{also}"),
        ("tasks", ", ".join(caps["tasks"])),
        ("modalities", ", ".join(caps["modalities"])),
        ("context", f"{caps['context_length']} tokens" if caps["context_length"] else None),
        ("languages", ", ".join(caps["languages"]) if caps["languages"] else None),
        ("architecture", detected.get("architecture")),
        ("name", detected.get("name")),
        ("trained context", detected.get("context_length")),
        ("quantization", detected.get("quantization")),
        ("parameters", detected.get("parameters")),
        ("assembled", ", ".join(f"{n} from {k} parts" for n, k in report["assembled"].items())),
        ("detection", report["detection_problem"]),
    ]


def _pairs(rows: list[tuple[str, Any]]) -> list[str]:
    return [f"  {label:<16}{value}" for label, value in rows if value not in (None, "")]


def _file_lines(files: list[dict[str, Any]]) -> list[str]:
    if not files:
        return []
    total = sum(f["bytes"] or 0 for f in files)
    here = sum(1 for f in files if f["local"])
    lines = [f"  {'files':<16}{len(files)}, {_human(total)} ({here} of {len(files)} on this machine)"]
    for file in files[:MAX_FILES_SHOWN]:
        where = "" if file["local"] else "  (to download)"
        lines.append(f"    {file['name']}  {_human(file['bytes'])}{where}")
    if len(files) > MAX_FILES_SHOWN:
        lines.append(f"    ... and {len(files) - MAX_FILES_SHOWN} more")
    return lines


def _human(size: int | None) -> str:
    if size is None:
        return "?"
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.1f} {unit}" if unit != "B" else f"{size} B"
        value /= 1024
    return f"{size} B"
