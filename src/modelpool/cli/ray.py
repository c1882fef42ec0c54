"""`modelpool serve --ray` and `modelpool ray ...`: modelpool on a Ray cluster (optional:
`pip install 'modelpool[ray]'`). Ray is imported only when one of these runs."""

from __future__ import annotations

import importlib.util
import signal
import threading
from typing import Annotated

import typer
import yaml

from modelpool.api.auth import KeyRing
from modelpool.cli.output import echo_err
from modelpool.config.schema import Config
from modelpool.errors import ConfigError

app = typer.Typer(help="modelpool on a Ray cluster (Ray Serve).", no_args_is_help=True)
AddressOpt = Annotated[
    str | None,
    typer.Option("--address", help="Ray cluster to join: auto, HOST:6379, ray://HOST:10001 (default: ray.address)."),
]


def require_ray() -> None:
    if importlib.util.find_spec("ray") is None or importlib.util.find_spec("ray.serve") is None:
        from modelpool.ray_serve import INSTALL_HINT

        echo_err(f"error: {INSTALL_HINT}")
        raise typer.Exit(2)


def serve_on_ray(config: Config, address: str | None) -> None:
    """Deploy on the cluster, serve until SIGINT/SIGTERM, then delete modelpool's apps (a
    Ray instance started here stops with it)."""
    require_ray()
    from modelpool.cli.serving import check_exposure
    from modelpool.ray_serve.deploy import connect, undeploy

    try:
        check_exposure(config, KeyRing.from_config(config.auth))
        connect(address or config.ray.address, config.server, config.ray.proxy_location)
    except ConfigError as exc:
        echo_err(f"error: {exc.message}")
        raise typer.Exit(2) from None
    for sig in (signal.SIGINT, signal.SIGTERM):  # from now on a signal stops serving, mid-deploy too
        signal.signal(sig, _exit_cleanly)
    try:  # connected: whatever happens now, modelpool's apps are taken off the cluster
        _deploy(config)
        typer.echo(f"modelpool on Ray Serve: http://{config.server.host}:{config.server.port} (Ctrl-C stops it)")
        threading.Event().wait()  # until a signal raises SystemExit
    finally:
        undeploy(config)


def _exit_cleanly(signum: int, frame: object) -> None:
    raise SystemExit(0)


def _deploy(config: Config) -> None:
    from modelpool.ray_serve.deploy import deploy

    try:
        deploy(config, progress=typer.echo)
    except ConfigError as exc:
        echo_err(f"error: {exc.message}")
        raise typer.Exit(2) from None


def deploy_command(config: Config, address: str | None) -> None:
    """Deploy and return; the applications keep running on the cluster (`ray down` removes them)."""
    require_ray()
    from modelpool.ray_serve.deploy import connect

    if not (address or config.ray.address):
        echo_err("error: `ray deploy` needs a running cluster to leave the apps on: --address auto (or ray.address)")
        raise typer.Exit(2)
    connect(address or config.ray.address, config.server, config.ray.proxy_location)
    _deploy(config)


def down_command(config: Config, address: str | None) -> None:
    require_ray()
    from modelpool.ray_serve.deploy import connect, undeploy

    connect(address or config.ray.address or "auto", config.server, config.ray.proxy_location)
    undeploy(config)
    typer.echo("modelpool's applications deleted")


def serve_config_command(config: Config, config_path: str) -> None:
    """Print the KubeRay `serveConfigV2` for this config (no Ray needed)."""
    from modelpool.ray_serve.serve_config import serve_config_v2

    try:
        typer.echo(yaml.safe_dump(serve_config_v2(config, config_path), sort_keys=False), nl=False)
    except ConfigError as exc:
        echo_err(f"error: {exc.message}")
        raise typer.Exit(2) from None
