"""`modelpool serve --ray` and `modelpool ray ...`: modelpool on a Ray cluster (optional:
`pip install 'modelpool[ray]'`). Ray is imported only when one of these runs."""

from __future__ import annotations

import importlib.util
import signal
import threading
from collections.abc import Iterator, Mapping
from typing import Annotated

import typer
import yaml

from modelpool.cli.output import echo_err
from modelpool.config.schema import Config
from modelpool.errors import ConfigError
from modelpool.server.auth import KeyRing

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
    from modelpool.ray_serve.deploy import undeploy

    try:
        keys = KeyRing.from_config(config.auth)
    except ConfigError as exc:
        echo_err(f"error: {exc.message}")
        raise typer.Exit(2) from None
    _join(config, address or config.ray.address, keys)
    for sig in (signal.SIGINT, signal.SIGTERM):  # from now on a signal stops serving, mid-deploy too
        signal.signal(sig, _exit_cleanly)
    try:  # connected: whatever happens now, modelpool's apps are taken off the cluster
        _deploy(config)
        typer.echo(f"modelpool on Ray Serve: http://{config.server.host}:{config.server.port} (Ctrl-C stops it)")
        threading.Event().wait()  # until a signal raises SystemExit
    finally:
        undeploy(config)


def _join(config: Config, address: str | None, keys: KeyRing | None) -> None:
    """Join (or start) the cluster and Serve's proxy, or exit 2 saying why not. With `keys`,
    `modelpool serve`'s exposure rule holds for the configured host and again for the one
    Serve's proxy binds (a Serve already running keeps its own)."""
    from modelpool.ray_serve.deploy import connect

    try:
        if keys is not None:
            refuse_exposure(config, keys)
        bound = connect(address, config.server, config.ray.proxy_location)
        if keys is not None:
            refuse_exposure(config, keys, host=bound)
    except ConfigError as exc:
        echo_err(f"error: {exc.message}")
        raise typer.Exit(2) from None


def refuse_exposure(config: Config, keys: KeyRing, *, host: str | None = None) -> None:
    """`modelpool serve`'s rule (`check_exposure`: no API keys, no non-loopback bind unless
    `auth.allow_unauthenticated_remote`), for the host Ray Serve's proxy binds."""
    from modelpool.server.auth import check_exposure

    if host is not None and host != config.server.host:
        config = config.model_copy(update={"server": config.server.model_copy(update={"host": host})})
    check_exposure(config, keys)


class _SetOnTheCluster(Mapping[str, str]):
    """The environment of the node that runs the ingress, where the keys' variables
    (`auth.keys[].key_env`) are set and read: from here, only that the config names keys
    counts (the ingress refuses to start on a node that lacks one)."""

    def __getitem__(self, name: str) -> str:
        return f"${name} on the cluster"

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


def cluster_keys(config: Config) -> KeyRing:
    """The API keys the ingress will check on the cluster, as far as this machine can tell."""
    return KeyRing.from_config(config.auth, environ=_SetOnTheCluster())


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
    if not (address or config.ray.address):
        echo_err("error: `ray deploy` needs a running cluster to leave the apps on: --address auto (or ray.address)")
        raise typer.Exit(2)
    _join(config, address or config.ray.address, cluster_keys(config))
    _deploy(config)


def down_command(config: Config, address: str | None) -> None:
    require_ray()
    from modelpool.ray_serve.deploy import undeploy

    _join(config, address or config.ray.address or "auto", None)
    undeploy(config)
    typer.echo("modelpool's applications deleted")


def serve_config_command(config: Config, config_path: str) -> None:
    """Print the KubeRay `serveConfigV2` for this config (no Ray needed)."""
    from modelpool.ray_serve.serve_config import PROXY_HOST, serve_config_v2

    try:
        refuse_exposure(config, cluster_keys(config), host=PROXY_HOST)
        typer.echo(yaml.safe_dump(serve_config_v2(config, config_path), sort_keys=False), nl=False)
    except ConfigError as exc:
        echo_err(f"error: {exc.message}")
        raise typer.Exit(2) from None
