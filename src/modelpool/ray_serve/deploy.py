"""Putting modelpool on a Ray cluster, taking it off, and the same deployment as a KubeRay
`serveConfigV2` (so the manifest and `modelpool serve --ray` deploy one thing)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import ray
from ray import serve

from modelpool.config.schema import Config, ServerConfig
from modelpool.errors import ConfigError
from modelpool.ray_serve import naming
from modelpool.ray_serve.apps import ingress_application, model_application
from modelpool.ray_serve.options import deployment_options, ingress_options

log = logging.getLogger("modelpool.ray")


def connect(address: str | None, server: ServerConfig, proxy_location: str) -> None:
    """Join (or start) the Ray cluster and start Ray Serve's HTTP proxy on the server's
    host and port. Serve already running keeps its own HTTP options (Ray cannot change them)."""
    if not ray.is_initialized():
        ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
    serve.start(proxy_location=proxy_location, http_options={"host": server.host, "port": server.port})


def deploy(config: Config, *, progress: Callable[[str], None] = log.info) -> None:
    """Deploy every model application, then the ingress; returns once all are running (a
    model that fails to load still runs: its replicas answer 503 with the load error)."""
    apps = naming.served_apps(config)
    if not apps:
        raise ConfigError("no models to serve")

    def run(app: str) -> None:
        progress(f"deploying {app} ({', '.join(m.id for m in apps[app])})")
        serve.run(model_application(config, app), name=app, route_prefix=None)
        progress(f"{app} is running")

    with ThreadPoolExecutor(max_workers=min(8, len(apps))) as pool:
        list(pool.map(run, apps))  # re-raises the first failure
    serve.run(ingress_application(config), name=naming.INGRESS_APP, route_prefix="/")
    progress("ingress is running")


def undeploy(config: Config) -> None:
    """Delete modelpool's applications (the cluster and Serve stay up)."""
    for app in [naming.INGRESS_APP, *naming.served_apps(config)]:
        serve.delete(app)


def wait_until_gone(apps: list[str], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not set(apps) & set(serve.status().applications):
            return
        time.sleep(0.2)


def serve_config_v2(config: Config, config_path: str) -> dict[str, Any]:
    """Ray Serve's declarative config (KubeRay `RayService.spec.serveConfigV2`) for the same
    applications `deploy()` runs, each built on the cluster from the config file at
    `config_path` (a path inside the pods)."""
    applications: list[dict[str, Any]] = []
    for app, models in naming.served_apps(config).items():
        options = deployment_options(models, config)
        applications.append(
            {
                "name": app,
                "import_path": "modelpool.ray_serve.apps:build_model",
                "route_prefix": None,
                "args": {"config": config_path, "app": app},
                "deployments": [{"name": "ModelReplica", **_yaml_safe(options)}],
            }
        )
    applications.append(
        {
            "name": naming.INGRESS_APP,
            "import_path": "modelpool.ray_serve.apps:build_ingress",
            "route_prefix": "/",
            "args": {"config": config_path},
            "deployments": [{"name": "Ingress", **_yaml_safe(ingress_options(config))}],
        }
    )
    return {
        "proxy_location": config.ray.proxy_location,
        "http_options": {"host": "0.0.0.0", "port": config.server.port},
        "applications": applications,
    }


def _yaml_safe(options: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in options.items() if value is not None}
