"""The Ray Serve applications: the ingress (modelpool's FastAPI app over a `RemotePool`) and
one application per model or multiplexed group. The builders at the bottom are also the
`import_path`s of the KubeRay serve config (`modelpool ray serve-config`)."""

from __future__ import annotations

import hashlib
import json
import logging
from functools import cache
from pathlib import Path
from typing import Any, cast

from fastapi import FastAPI
from ray import serve
from ray.serve import Application
from ray.serve.deployment import Deployment

from modelpool import __version__
from modelpool.config.loader import load_config
from modelpool.config.schema import Config, ModelConfig
from modelpool.errors import ConfigError
from modelpool.logs import configure_logging
from modelpool.ray_serve import naming
from modelpool.ray_serve.options import deployment_options, ingress_options
from modelpool.ray_serve.remote_pool import RemotePool
from modelpool.ray_serve.replica import ModelReplica, Resident, load_resident
from modelpool.server.app import create_app

log = logging.getLogger("modelpool.ray")


def config_payload(config: Config) -> dict[str, Any]:
    """The config as it travels to replicas (JSON-safe; API keys are never in it: a config
    names the environment variable that holds each one, read on the node that checks it)."""
    return config.model_dump(mode="json", exclude_unset=True)


@serve.deployment(name="Ingress")
@serve.ingress()
class Ingress:
    """modelpool's own HTTP API, built inside the replica (nothing of it is pickled)."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = Config.model_validate(config)
        configure_logging(self.config.server.log_format, self.config.server.log_level)

    def __serve_build_asgi_app__(self) -> FastAPI:
        return create_app(self.config, RemotePool(self.config, redeploy=self.redeploy))

    def redeploy(self, app: str, changes: dict[str, Any]) -> None:
        """Hand an admin's change to one model application to Ray Serve; returns once Serve
        has it (the caller watches the application until it runs again)."""
        target = serve.RunTarget(model_application(self.config, app, **changes), name=app, route_prefix=None)
        serve.run_many([target], wait_for_applications_running=False)


@cache
def group_replica(max_models: int) -> type[ModelReplica]:
    """The replica class of groups keeping `max_models` models per replica: the multiplexed
    loader must be decorated with its size when the class is made."""

    class GroupReplica(ModelReplica):
        @serve.multiplexed(max_num_models_per_replica=max_models)
        async def _resident(self, model_id: str) -> Resident:
            return await load_resident(self, model_id)

    GroupReplica.__name__ = GroupReplica.__qualname__ = f"GroupReplica{max_models}"
    return GroupReplica


def model_application(
    config: Config,
    app: str,
    *,
    num_replicas: int | None = None,
    overrides: dict[str, dict[str, Any]] | None = None,
) -> Application:
    """The application `app` (a model's, or a group's) as Ray Serve deploys it."""
    models = naming.served_apps(config).get(app)
    if models is None:
        raise ConfigError(f"no model or group is served as Ray Serve application '{app}'")
    group_size = _group_size(models, config)
    replica_class = ModelReplica if group_size is None else group_replica(group_size)
    deployment = serve.deployment(name="ModelReplica")(replica_class)
    deployment = deployment.options(
        **deployment_options(models, config, num_replicas=num_replicas),
        user_config={"overrides": overrides or {}},
        # The same version for the same models: Serve then applies a new replica count or
        # user_config to running replicas instead of replacing them all (without one, every
        # `serve.run` gets a random version: a rolling restart). Serve 2.60 keeps `version`
        # for its own callers (`_internal`); the admin tests check no replica is replaced.
        version=replica_version(models, group_size),
        _internal=True,
    )
    replica_payload = config.model_copy(update={"auth": type(config.auth)()})
    return deployment.bind(config_payload(replica_payload), [m.id for m in models], group_size)


def replica_version(models: list[ModelConfig], group_size: int | None) -> str:
    """What a replica runs, as a short hash: the models' settings, the group size, modelpool's version."""
    what = [[m.model_dump(mode="json") for m in models], group_size, __version__]
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]


def _group_size(models: list[ModelConfig], config: Config) -> int | None:
    first = models[0]
    if first.ray is None or first.ray.group is None:
        return None
    return config.ray.groups[first.ray.group].max_models_per_replica


def ingress_application(config: Config) -> Application:
    ingress = cast(Deployment, Ingress)  # serve.deployment made the class a Deployment
    return ingress.options(**ingress_options(config)).bind(config_payload(config))


# ----- builders for `serve run` / KubeRay's serveConfigV2 (`args: {config: PATH, ...}`) --------


def _config_from(args: dict[str, Any]) -> Config:
    path = args.get("config")
    if not isinstance(path, str):
        raise ConfigError("the application's args need `config`: the path of modelpool's config file")
    return load_config(Path(path))


def build_ingress(args: dict[str, Any]) -> Application:
    return ingress_application(_config_from(args))


def build_model(args: dict[str, Any]) -> Application:
    app = args.get("app")
    if not isinstance(app, str):
        raise ConfigError("a model application's args need `app`: its application name (mp-<model> or mpg-<group>)")
    return model_application(_config_from(args), app)
