"""Ray Serve deployment options from modelpool's config (pure; no Ray import), shared by
`deploy()`, the admin's redeploys and the KubeRay serve config, so all three agree."""

from __future__ import annotations

from typing import Any

from modelpool.config.ray import RayActorOptions, RayScaling
from modelpool.config.schema import Config, ModelConfig

DEFAULT_SCALING = RayScaling()
HEAD_NODE_RESOURCE = "node:__internal_head__"
"""The resource Ray gives the head node alone, 1 of it (`ray_constants.HEAD_NODE_RESOURCE_NAME`;
Serve pins its own controller with it). Spelled out here: this module imports no Ray."""
HEAD_PIN = 0.001
"""What one ingress replica asks of it: a thousand replicas fit on the head."""


def actor_options(options: RayActorOptions) -> dict[str, Any]:
    """`ray_actor_options` as Ray takes them (unset ones left out)."""
    out: dict[str, Any] = {"num_cpus": options.num_cpus}
    if options.num_gpus:
        out["num_gpus"] = options.num_gpus
    if options.memory is not None:
        out["memory"] = options.memory
    if options.resources:
        out["resources"] = dict(options.resources)
    return out


def scaling_of(models: list[ModelConfig], config: Config) -> RayScaling:
    """The scaling of the application serving `models`: its group's, or its one model's."""
    first = models[0]
    if first.ray is not None and first.ray.group is not None:
        return config.ray.groups[first.ray.group]
    return first.ray or DEFAULT_SCALING


def deployment_options(models: list[ModelConfig], config: Config, *, num_replicas: int | None = None) -> dict[str, Any]:
    """Options of the model deployment serving `models` (`num_replicas`: an admin's rescale,
    which pins a fixed count, or raises an autoscaled deployment's floor)."""
    scaling = scaling_of(models, config)
    options: dict[str, Any] = {
        "ray_actor_options": actor_options(scaling.ray_actor_options),
        "max_ongoing_requests": max_ongoing(models),
        # Requests a caller holds back while every replica is full (then 429). Ray takes -1
        # (no limit) or at least 1: a model with no queue (`max_queue: 0`) gets 1.
        "max_queued_requests": max(1, sum(m.max_queue for m in models)),
        "graceful_shutdown_timeout_s": config.ray.replica_shutdown_grace_s,
        # Health checks run on the replica's loop next to the model's work: a busy engine
        # thread must not make one look dead.
        "health_check_timeout_s": 60.0,
    }
    if scaling.max_replicas_per_node is not None:
        options["max_replicas_per_node"] = scaling.max_replicas_per_node
    autoscaling = scaling.autoscaling
    if autoscaling is None:
        fixed = scaling.num_replicas or (models[0].replicas if len(models) == 1 else 1)  # a group: 1
        options["num_replicas"] = num_replicas or fixed
    else:
        auto = autoscaling.model_dump(exclude_none=True)
        if num_replicas is not None:
            auto["min_replicas"] = num_replicas
            auto.pop("initial_replicas", None)
        options["autoscaling_config"] = auto
    return options


def max_ongoing(models: list[ModelConfig]) -> int:
    """Requests a replica takes at once: what its pool admits (running plus queued), so the
    slot's own queue and batching see the load, as in one process."""
    return max(1, sum((m.max_concurrency or 4) + m.max_queue for m in models))


def replica_bounds(models: list[ModelConfig], config: Config) -> tuple[int, int]:
    """The replica counts an admin may ask for: 1 up to the autoscaling maximum (or the
    model's `replica_max` when fixed)."""
    scaling = scaling_of(models, config)
    if scaling.autoscaling is not None:
        return 1, scaling.autoscaling.max_replicas
    return 1, max(scaling.num_replicas or 1, *(m.replica_max for m in models))


def ingress_options(config: Config) -> dict[str, Any]:
    ingress = config.ray.ingress
    actor = actor_options(ingress.ray_actor_options)
    if ingress.on_head:  # its in-memory state must not go with a worker node (RayIngressConfig.on_head)
        actor["resources"] = {**actor.get("resources", {}), HEAD_NODE_RESOURCE: HEAD_PIN}
    return {
        "num_replicas": ingress.num_replicas,
        "ray_actor_options": actor,
        "max_ongoing_requests": 1000,
        "graceful_shutdown_timeout_s": config.server.shutdown_grace_s,
    }
