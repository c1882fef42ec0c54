"""What a re-read config changes against the running one, sorted by how it can be applied:
models added, removed, changed in a way that needs a reload of their weights, changed only
in what applies at once ("hot"), settings applied live (keys, rate limits, default models),
and settings that only a restart applies. Pure: the pool and the server apply it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from modelpool.config.schema import Config, ModelConfig

HOT_MODEL_FIELDS = frozenset({
    "aliases", "description", "owned_by", "install_hint", "preload", "autoload", "keep_alive", "pinned",
    "max_concurrency", "max_queue", "max_queue_per_key", "priority_aging_s",
    "replica_max", "retry_cooldown_s", "restart_backoff_s", "max_restarts",
    "allow_remote", "warmup", "sampling", "enable_thinking", "reasoning_parser", "tool_parser",
    "constrained_auto_tools",
})  # fmt: skip
"""A model's fields read per request or per load decision, never baked into a loaded engine:
a change to them applies at once, without a reload. Any other field (backend, source,
tasks, options, replicas, batch, memory_bytes, ...) is part of what was loaded: the model
reloads at its next idle moment. A field added later counts as reloading until listed here."""

LIVE_SECTIONS = ("models", "enabled_models", "starter_models", "auth", "defaults")
"""Top-level settings a reload applies: the served models, the API keys and their rate
limits, the default models and sampling. Every other setting needs a restart."""


@dataclass(frozen=True)
class ModelChange:
    id: str
    fields: tuple[str, ...]
    """The changed fields' names (never their values: an option may hold a secret's name)."""


@dataclass(frozen=True)
class ConfigDiff:
    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    reloading: tuple[ModelChange, ...] = ()
    """Changed models that keep serving their old config until idle, then reload."""
    hot: tuple[ModelChange, ...] = ()
    """Changed models whose changes applied at once."""
    live: tuple[str, ...] = ()
    """Changed server-wide settings applied at once (dotted paths: `auth.keys`)."""
    needs_restart: tuple[str, ...] = ()
    """Changed settings that take effect only after a restart (dotted paths: `server.port`)."""
    unchanged: int = 0
    """Served models that did not change."""

    @property
    def empty(self) -> bool:
        return not (self.added or self.removed or self.reloading or self.hot or self.live or self.needs_restart)


def diff_configs(running: Config, wanted: Config) -> ConfigDiff:
    """How `wanted` (the re-read config) differs from `running`."""
    old = {model.id: model for model in running.served_models()}
    new = {model.id: model for model in wanted.served_models()}
    reloading: list[ModelChange] = []
    hot: list[ModelChange] = []
    for model_id in sorted(old.keys() & new.keys()):
        fields = changed_fields(old[model_id], new[model_id])
        if not fields:
            continue
        target = hot if set(fields) <= HOT_MODEL_FIELDS else reloading
        target.append(ModelChange(model_id, fields))
    before, after = running.model_dump(mode="json"), wanted.model_dump(mode="json")
    live = [path for section in ("auth", "defaults")
            for path in changed_paths(before[section], after[section], section)]  # fmt: skip
    restart = [
        path
        for section in sorted(before.keys() - set(LIVE_SECTIONS))
        for path in changed_paths(before[section], after.get(section), section)
    ]
    return ConfigDiff(
        added=tuple(sorted(new.keys() - old.keys())),
        removed=tuple(sorted(old.keys() - new.keys())),
        reloading=tuple(reloading),
        hot=tuple(hot),
        live=tuple(live),
        needs_restart=tuple(restart),
        unchanged=len(old.keys() & new.keys()) - len(reloading) - len(hot),
    )


def with_hot_fields(running: ModelConfig, wanted: ModelConfig) -> ModelConfig:
    """`running` with `wanted`'s hot fields: what a served model takes at once. Its other
    fields stay those its engine was loaded with, even when `wanted` changes them too (a
    reload waiting for the model's next idle moment brings them then)."""
    return running.model_copy(update={field: getattr(wanted, field) for field in HOT_MODEL_FIELDS})


def changed_fields(old: ModelConfig, new: ModelConfig) -> tuple[str, ...]:
    before, after = old.model_dump(mode="json"), new.model_dump(mode="json")
    return tuple(sorted(key for key in before.keys() | after.keys() if before.get(key) != after.get(key)))


def changed_paths(before: Any, after: Any, path: str, depth: int = 1) -> list[str]:
    """The dotted paths under `path` whose values differ, down to `depth` levels (a list or
    a deeper mapping is named whole)."""
    if before == after:
        return []
    if depth == 0 or not (isinstance(before, Mapping) and isinstance(after, Mapping)):
        return [path]
    keys = sorted(before.keys() | after.keys())
    return [p for key in keys for p in changed_paths(before.get(key), after.get(key), f"{path}.{key}", depth - 1)]
