"""Putting modelpool on a Ray cluster and taking it off (`serve_config.py` writes the same
deployment as a KubeRay `serveConfigV2`)."""

from __future__ import annotations

import logging
from collections.abc import Callable

import ray
from ray import serve

from modelpool.config.schema import Config, ServerConfig
from modelpool.errors import ConfigError
from modelpool.ray_serve import naming
from modelpool.ray_serve.apps import ingress_application, model_application

log = logging.getLogger("modelpool.ray")


def connect(address: str | None, server: ServerConfig, proxy_location: str) -> None:
    """Join (or start) the Ray cluster and start Ray Serve's HTTP proxy on the server's
    host and port. Serve already running keeps its own HTTP options (Ray cannot change them)."""
    if not ray.is_initialized():
        # No address: a new Ray instance of modelpool's own ("local": never one that Ray's
        # address file or RAY_ADDRESS points at), without a dashboard.
        dashboard = False if address is None else None
        ray.init(
            address=address or "local", logging_level=logging.WARNING, log_to_driver=False, include_dashboard=dashboard
        )
    serve.start(proxy_location=proxy_location, http_options={"host": server.host, "port": server.port})


def deploy(config: Config, *, progress: Callable[[str], None] = log.info) -> None:
    """Deploy every model application, then the ingress; returns once all are running (a
    model that fails to load still runs: its replicas answer 503 with the load error)."""
    apps = naming.served_apps(config)
    if not apps:
        raise ConfigError("no models to serve")

    for app, models in apps.items():
        progress(f"deploying {app} ({', '.join(m.id for m in models)})")
    targets = [serve.RunTarget(model_application(config, app), name=app, route_prefix=None) for app in apps]
    serve.run_many(targets)  # all at once; returns when every one is running
    progress("models are running")
    serve.run(ingress_application(config), name=naming.INGRESS_APP, route_prefix="/")
    progress("ingress is running")


def undeploy(config: Config) -> None:
    """Delete modelpool's applications (the cluster and Serve stay up)."""
    for app in [naming.INGRESS_APP, *naming.served_apps(config)]:
        serve.delete(app)
