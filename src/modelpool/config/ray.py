"""Settings read only in Ray mode (`modelpool serve --ray`, `modelpool ray ...`): how each
model becomes a Ray Serve deployment, and where the ingress runs. The single-process
server ignores them, so one config file serves both ways."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


class RayActorOptions(_Strict):
    """What one replica reserves on a Ray node; Ray places it on a node that has it."""

    num_cpus: float = Field(default=0.25, ge=0)
    """Logical CPUs reserved per replica (fractional: Ray's default of 1 crowds small nodes)."""
    num_gpus: float = Field(default=0, ge=0)
    """GPUs reserved per replica (fractional shares a GPU between replicas)."""
    memory: int | None = Field(default=None, ge=0)
    """Bytes of memory reserved per replica, for placement (Ray does not enforce it)."""
    resources: dict[str, float] = Field(default_factory=dict)
    """Custom resources per replica: a replica lands only on nodes started with them
    (`ray start --resources`), e.g. `{gpu_a100: 1}` or a label you give some nodes."""


class RayAutoscaling(_Strict):
    """Ray Serve's replica autoscaling: replicas follow the requests in flight per replica."""

    min_replicas: int = Field(default=1, ge=0)
    """Fewest replicas; 0 scales to zero when idle and starts one on the next request."""
    max_replicas: int = Field(default=1, ge=1)
    """Most replicas."""
    initial_replicas: int | None = Field(default=None, ge=0)
    """Replicas at deploy time (default: min_replicas)."""
    target_ongoing_requests: float = Field(default=2.0, gt=0)
    """Requests in flight per replica that the autoscaler aims for."""
    upscale_delay_s: float = Field(default=30.0, ge=0)
    """How long load must stay above target before a replica is added."""
    downscale_delay_s: float = Field(default=600.0, ge=0)
    """How long load must stay below target before a replica is removed."""
    downscale_to_zero_delay_s: float | None = Field(default=None, ge=0)
    """Idle time before the last replica goes, with min_replicas 0 (default: downscale_delay_s)."""
    look_back_period_s: float = Field(default=30.0, gt=10)
    """Window over which the load is averaged; more than 10 s (Ray Serve's metrics interval)."""

    @model_validator(mode="after")
    def _bounds(self) -> RayAutoscaling:
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas ({self.min_replicas}) exceeds max_replicas ({self.max_replicas})")
        initial = self.initial_replicas
        if initial is not None and not self.min_replicas <= initial <= self.max_replicas:
            raise ValueError("initial_replicas must lie between min_replicas and max_replicas")
        return self


class RayScaling(_Strict):
    """How many replicas a deployment runs, and what each one reserves."""

    num_replicas: int | None = Field(default=None, ge=1)
    """A fixed number of replicas (default: the model's `replicas`, or 1 for a group).
    Give this or `autoscaling`, not both."""
    autoscaling: RayAutoscaling | None = None
    """Scale with load between min_replicas and max_replicas instead of a fixed number."""
    max_replicas_per_node: int | None = Field(default=None, ge=1)
    """At most this many replicas on one node (1 spreads replicas over nodes)."""
    ray_actor_options: RayActorOptions = Field(default_factory=RayActorOptions)
    """Resources each replica reserves."""

    @model_validator(mode="after")
    def _one_way_to_scale(self) -> RayScaling:
        if self.num_replicas is not None and self.autoscaling is not None:
            raise ValueError("give num_replicas or autoscaling, not both")
        return self


class RayModelConfig(RayScaling):
    """A model's own Ray Serve deployment (`models.<id>.ray`)."""

    group: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    """Serve this model from the replicas of the multiplexed group `ray.groups.<group>`
    instead of a deployment of its own (its scaling comes from the group)."""

    @model_validator(mode="after")
    def _grouped_models_take_the_group_scaling(self) -> RayModelConfig:
        if self.group is not None and self.model_fields_set - {"group"}:
            raise ValueError(
                f"a model in group '{self.group}' is scaled by the group: set "
                f"{', '.join(sorted(self.model_fields_set - {'group'}))} under ray.groups.{self.group}"
            )
        return self


class RayGroupConfig(RayScaling):
    """Many small models on a few replicas (Ray Serve model multiplexing): each replica keeps
    up to `max_models_per_replica` of the group's models loaded, least recently used
    unloaded first, and requests go to a replica that has their model when one does."""

    max_models_per_replica: int = Field(default=2, ge=1)
    """Models loaded at once on one replica."""


class RayIngressConfig(_Strict):
    """The deployment that runs modelpool's HTTP API and forwards work to model replicas."""

    num_replicas: int = Field(default=1, ge=1)
    """Ingress replicas. Each keeps its own rate-limit budgets, usage and stored responses
    (`previous_response_id`), so more than 1 splits them."""
    ray_actor_options: RayActorOptions = Field(default_factory=lambda: RayActorOptions(num_cpus=0.1))
    """Resources of an ingress replica."""
    on_head: bool = True
    """Keep the ingress on the head node (it asks for Ray's `node:__internal_head__`
    resource, which only the head has). The ingress holds state in memory (metrics, per-key
    usage and rate-limit budgets, admin overrides, stored responses): on a worker node, that
    node's loss would take it; the head's loss ends the cluster anyway. Off: Ray places it on
    any node with room (pin it yourself with `ray_actor_options.resources`)."""


class RaySettings(_Strict):
    """Ray mode as a whole (`modelpool serve --ray`)."""

    address: str | None = None
    """The Ray cluster to join (`auto`, `ray://host:10001`, `host:6379`); the CLI's
    `--ray ADDRESS` wins; none: start a local Ray instance."""
    proxy_location: Literal["HeadOnly", "EveryNode", "Disabled"] = "HeadOnly"
    """Where Ray Serve runs its HTTP proxy: only on the head node, or on every node."""
    replica_shutdown_grace_s: float = Field(default=300.0, ge=0)
    """How long a model replica that Serve stops (scaling down, a node drained) lets its
    requests in flight finish before they are cut (502)."""
    status_interval_s: float = Field(default=2.0, gt=0)
    """How often the ingress asks the replicas how they are (for `/v1/admin/models`,
    `/readyz` and the metrics page)."""
    ingress: RayIngressConfig = Field(default_factory=RayIngressConfig)
    """The ingress deployment."""
    groups: dict[str, RayGroupConfig] = Field(default_factory=dict)
    """Multiplexed model groups by name; models join with `ray: {group: NAME}`."""
