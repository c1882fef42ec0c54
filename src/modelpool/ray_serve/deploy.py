"""Putting modelpool on a Ray cluster and taking it off (`serve_config.py` writes the same
deployment as a KubeRay `serveConfigV2`)."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable

import ray
from ray import serve
from ray.serve import context as serve_context

from modelpool.config.schema import Config, ServerConfig
from modelpool.errors import ConfigError
from modelpool.ray_serve import naming
from modelpool.ray_serve.apps import ingress_application, model_application
from modelpool.ray_serve.joining import join_failure, probe, stderr_captured

log = logging.getLogger("modelpool.ray")


def connect(address: str | None, server: ServerConfig, proxy_location: str) -> str:
    """Join (or start) the Ray cluster and start Ray Serve's HTTP proxy on the server's
    host and port; returns the host Serve's proxies bind. Serve already running keeps its
    own HTTP options (Ray cannot change them). A cluster that cannot be joined is a
    `ConfigError` that says why, in one line."""
    if not ray.is_initialized():
        if address is None:
            # A new Ray instance of modelpool's own ("local": never one that Ray's address
            # file or RAY_ADDRESS points at), without a dashboard.
            ray.init(address="local", logging_level=logging.WARNING, log_to_driver=False, include_dashboard=False)
        else:
            _join(address)
    serve.start(proxy_location=proxy_location, http_options={"host": server.host, "port": server.port})
    return _bound_host(server.host)


def _join(address: str) -> None:
    probe(address)
    failure: Exception | None = None
    with stderr_captured() as captured:  # Ray's core logs the cause there, a line a second
        try:
            ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
        except Exception as exc:
            failure = exc
    if failure is not None:
        raise ConfigError(join_failure(address, failure, captured.text)) from None
    sys.stderr.write(captured.text)  # joined: what Ray said meanwhile is the operator's to read


def _bound_host(asked: str) -> str:
    """The host Serve's proxies listen on: its controller's HTTP options (Serve started
    earlier with others keeps them). Read through Serve's client, which has no public getter."""
    client = serve_context._get_global_client(raise_if_no_controller_running=False)
    config = getattr(client, "http_config", None)
    host = getattr(config, "host", None)
    return host if isinstance(host, str) else asked


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
