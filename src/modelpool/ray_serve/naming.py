"""Names of the Ray Serve applications modelpool deploys (no Ray import)."""

from __future__ import annotations

import re

from modelpool.config.schema import Config, ModelConfig
from modelpool.errors import ConfigError

INGRESS_APP = "modelpool"
MODEL_APP_PREFIX = "mp-"
GROUP_APP_PREFIX = "mpg-"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def model_app(model_id: str) -> str:
    return MODEL_APP_PREFIX + _UNSAFE.sub("_", model_id)


def group_app(group: str) -> str:
    return GROUP_APP_PREFIX + group


def app_of(model: ModelConfig) -> str:
    """The application serving `model`: its group's, or its own."""
    if model.ray is not None and model.ray.group is not None:
        return group_app(model.ray.group)
    return model_app(model.id)


def served_apps(config: Config) -> dict[str, list[ModelConfig]]:
    """Every model application (its name → the models its replicas serve), checked: each
    group a model names exists, and no two models' ids map to one application name."""
    apps: dict[str, list[ModelConfig]] = {}
    for model in config.served_models():
        group = model.ray.group if model.ray is not None else None
        if group is not None and group not in config.ray.groups:
            known = ", ".join(sorted(config.ray.groups)) or "none"
            raise ConfigError(f"models.{model.id}.ray.group: no group '{group}' under ray.groups (known: {known})")
        name = app_of(model)
        if group is None and name in apps:
            raise ConfigError(
                f"models '{apps[name][0].id}' and '{model.id}' would share the Ray Serve application name "
                f"'{name}': rename one"
            )
        apps.setdefault(name, []).append(model)
    return apps
