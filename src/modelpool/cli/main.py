"""`modelpool` commands. Server-side verbs (serve, models) build from the config directly."""

from __future__ import annotations

import json
import platform
from pathlib import Path
from typing import Annotated, Any

import typer

from modelpool import __version__
from modelpool.cli import admin, processes, stack
from modelpool.cli import bench as bench_cli
from modelpool.cli import cache as cache_cli
from modelpool.cli import credentials as credentials_cli
from modelpool.cli import pull as pull_cli
from modelpool.cli import ray as ray_cli
from modelpool.cli import ready as ready_cli
from modelpool.cli import run as run_cli
from modelpool.cli import show as show_cli
from modelpool.cli import status as status_cli
from modelpool.cli.output import echo_err, print_models_table
from modelpool.config import load_config
from modelpool.config.environment import apply_openmp_waits
from modelpool.config.loader import config_files
from modelpool.config.redact import redacted_config
from modelpool.config.schema import Config, LogFormat
from modelpool.errors import ConfigError

app = typer.Typer(
    name="modelpool",
    help="A pool of local and remote AI models behind one OpenAI-compatible API.",
    no_args_is_help=True,
    add_completion=True,  # --install-completion / --show-completion (bash, zsh, fish, PowerShell)
)
PROGRAM = "modelpool"

PRINT_CONFIG_HELP = "Print the effective config (secrets redacted) and exit."
WATCH_HELP = "Re-read the config file when it changes and apply the difference (as SIGHUP does)."
DRY_RUN_HELP = "Load every served model, report, and exit non-zero on any load failure."
RAY_HELP = "Serve on Ray Serve: each model a deployment on the cluster (pip install 'modelpool[ray]')."
RAY_ADDRESS_HELP = "The Ray cluster for --ray (auto, HOST:6379, ray://HOST:10001); implies --ray."
ConfigOpt = Annotated[Path | None, typer.Option("--config", "-c", help="YAML config file.", dir_okay=False)]
LocalOpt = Annotated[
    Path | None, typer.Option("--local-config", help="Local override file (default: <config>.local.yaml).")
]
MODELS_ARG_HELP = (
    "Models to serve: a .gguf file, a model folder (Hugging Face, CTranslate2/Whisper, a Piper or Kokoro voice), "
    "hf:org/repo[:Q4_K_M|:file][@rev], or a catalog id. Backend and tasks are detected from the files."
)
NAME_HELP = "The id of each MODEL, in order (default: a slug of its file, folder or repo name)."


def _print_version(wanted: bool) -> None:
    if wanted:
        typer.echo(version_line())
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[
        bool | None,
        typer.Option("--version", "-V", help="Print the version (and Python's) and exit.", is_eager=True,
                     callback=_print_version),
    ] = None,
) -> None:  # fmt: skip
    """A pool of local and remote AI models behind one OpenAI-compatible API."""


def version_line() -> str:
    """`modelpool 0.1.0 (Python 3.11.7)`: the installed package's version, from its metadata."""
    return f"{PROGRAM} {__version__} (Python {platform.python_version()})"


@app.command()
def serve(
    sources: Annotated[list[str] | None, typer.Argument(metavar="[MODEL]...", help=MODELS_ARG_HELP)] = None,
    name: Annotated[list[str] | None, typer.Option("--name", help=NAME_HELP)] = None,
    host: Annotated[str | None, typer.Option(help="Interface to bind (default 127.0.0.1).")] = None,
    port: Annotated[int | None, typer.Option(help="Port to listen on (default 8000).")] = None,
    config: ConfigOpt = None,
    local_config: LocalOpt = None,
    models: Annotated[str | None, typer.Option("--models", help="Comma-separated ids to serve (default: all).")] = None,
    log_format: Annotated[LogFormat | None, typer.Option(help="text or json.")] = None,
    log_level: Annotated[str | None, typer.Option(help="debug, info, warning, error.")] = None,
    print_config: Annotated[bool, typer.Option("--print-config", help=PRINT_CONFIG_HELP)] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help=DRY_RUN_HELP)] = False,
    watch_config: Annotated[bool, typer.Option("--watch-config", help=WATCH_HELP)] = False,
    on_ray: Annotated[bool, typer.Option("--ray", help=RAY_HELP)] = False,
    ray_address: Annotated[str | None, typer.Option("--ray-address", help=RAY_ADDRESS_HELP)] = None,
) -> None:
    """Start the OpenAI-compatible server (with --ray: on a Ray cluster, through Ray Serve)."""
    server = _given(host=host, port=port, log_format=log_format, log_level=log_level, watch_config=watch_config or None)
    overrides: dict[str, Any] = {"server": server}
    if models:
        overrides["enabled_models"] = [m.strip() for m in models.split(",") if m.strip()]
    if sources or name:
        overrides = _with_named(sources or [], name or [], overrides, config, local_config)
    cfg = _load(config, local_config, overrides)
    if print_config:
        typer.echo(json.dumps(redacted_config(cfg), indent=2))
        return
    from modelpool.cli.serving import dry_run_models, run_server
    from modelpool.server.reload import ConfigSources

    apply_openmp_waits()  # before any engine loads OpenMP
    if dry_run:
        raise typer.Exit(dry_run_models(cfg))
    if on_ray or ray_address:
        ray_cli.serve_on_ray(cfg, ray_address)
        return
    # A reload reads the same layers again: the file, its override, the environment, these flags.
    reread = ConfigSources(lambda: load_config(config, local_file=local_config, cli=overrides),
                           config_files(config, local_file=local_config))  # fmt: skip
    run_server(cfg, reread)


@app.command("models")
def list_models(config: ConfigOpt = None, local_config: LocalOpt = None) -> None:
    """List the catalog: each model, what it does, whether it is served and installed."""
    print_models_table(_load(config, local_config, {}))


app.command("run")(run_cli.run)
app.command("bench")(bench_cli.bench)
app.command("ps")(admin.ps)
app.command("pull")(pull_cli.pull_command)
app.command("show")(show_cli.show_command)
app.command("load")(admin.load)
app.command("unload")(admin.unload)
app.command("reload")(admin.reload)
app.command("stop-persistent")(processes.stop_persistent)
app.command("up")(stack.up)
app.command("down")(stack.down)
app.command("status")(status_cli.status)
app.command("logs")(stack.logs)
app.add_typer(ray_cli.app, name="ray")
app.add_typer(cache_cli.app, name="cache")
app.add_typer(credentials_cli.app, name="credentials")


@ray_cli.app.command("deploy")
def ray_deploy(address: ray_cli.AddressOpt = None, config: ConfigOpt = None, local_config: LocalOpt = None) -> None:
    """Deploy modelpool's applications on a running Ray cluster and return (they keep running)."""
    ray_cli.deploy_command(_load(config, local_config, {}), address)


@ray_cli.app.command("down")
def ray_down(address: ray_cli.AddressOpt = None, config: ConfigOpt = None, local_config: LocalOpt = None) -> None:
    """Delete modelpool's applications from the Ray cluster."""
    ray_cli.down_command(_load(config, local_config, {}), address)


@ray_cli.app.command("serve-config")
def ray_serve_config(
    config: ConfigOpt = None,
    local_config: LocalOpt = None,
    config_path: Annotated[
        str, typer.Option("--config-path", help="Where the config file is inside the cluster's pods.")
    ] = "/etc/modelpool/modelpool.yaml",
) -> None:
    """Print the KubeRay RayService serveConfigV2 for this config (see deploy/kuberay/)."""
    ray_cli.serve_config_command(_load(config, local_config, {}), config_path)


@app.command("ready")
def ready(
    url: ready_cli.ReadyUrlOpt = None,
    api_key: admin.KeyOpt = None,
    model: ready_cli.ModelOpt = None,
    wait: ready_cli.WaitOpt = 0.0,
    config: ConfigOpt = None,
    local_config: LocalOpt = None,
) -> None:
    """Exit 0 once the server's /readyz answers 200 (every preloaded model ready), else 1:
    for systemd's ExecStartPost, a container HEALTHCHECK, scripts. Without --url, the
    server the config names (the same --config as `serve`)."""
    if url is None:
        try:
            url = ready_cli.url_of(_load(config, local_config, {}).server)
        except ValueError as exc:
            echo_err(f"error: {exc}")
            raise typer.Exit(2) from None
    ready_cli.wait_until_ready(ready_cli.checked_url(url), api_key=api_key, model=model, wait_s=wait)


@app.command("config-schema")
def config_schema() -> None:
    """Print the JSON schema of the config file."""
    typer.echo(json.dumps(Config.model_json_schema(), indent=2))


@app.command("config-reference")
def config_reference(
    doc: Annotated[
        Path | None,
        typer.Option(help="Rewrite the reference block of this Markdown file in place (docs/configuration.md)."),
    ] = None,
) -> None:
    """Print the config reference (Markdown), as found in docs/configuration.md."""
    from modelpool.cli.reference import reference_markdown, splice_into

    if doc is None:
        typer.echo(reference_markdown(), nl=False)
    else:
        doc.write_text(splice_into(doc.read_text(), reference_markdown()))


def _given(**values: Any) -> dict[str, Any]:
    return {k: v.value if hasattr(v, "value") else v for k, v in values.items() if v is not None}


def _with_named(
    sources: list[str], names: list[str], overrides: dict[str, Any], config: Path | None, local_config: Path | None
) -> dict[str, Any]:
    """The CLI layer with the models named on the command line (see cli/serve_sources.py)."""
    from modelpool.cli.serve_sources import serve_overrides
    from modelpool.config.environment import config_file_named

    base = _load(config, local_config, overrides)
    file_given = (config or config_file_named()) is not None
    try:
        return serve_overrides(sources, names, base, overrides, config_file=file_given)
    except ConfigError as exc:
        echo_err(f"error: {exc.message}")
        raise typer.Exit(2) from None


def _load(config: Path | None, local_config: Path | None, cli: dict[str, Any]) -> Config:
    try:
        return load_config(config, local_file=local_config, cli=cli)
    except ConfigError as exc:
        echo_err(f"error: {exc.message}")
        raise typer.Exit(2) from None


def run() -> None:
    # The program's name, not `python -m modelpool`: completion scripts are keyed on it.
    app(prog_name=PROGRAM)
