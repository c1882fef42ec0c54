"""The difference a re-read config makes, sorted by how it applies (config/reload_diff.py)."""

from __future__ import annotations

from typing import Any

from modelpool.config.loader import validate_config
from modelpool.config.reload_diff import HOT_MODEL_FIELDS, ModelChange, diff_configs
from modelpool.config.schema import Config, ModelConfig

ECHO = "tests.fakes:EchoBackend"


def config(**models: dict[str, Any]) -> Config:
    return validate_config({"starter_models": False, "models": {k: {"backend": ECHO, **v} for k, v in models.items()}})


def test_same_config_is_an_empty_diff_counting_the_unchanged() -> None:
    diff = diff_configs(config(a={}, b={}), config(a={}, b={}))
    assert diff.empty and diff.unchanged == 2


def test_models_added_and_removed_by_id() -> None:
    diff = diff_configs(config(a={}, b={}), config(b={}, c={}))
    assert (diff.added, diff.removed, diff.unchanged) == (("c",), ("a",), 1)


def test_an_engine_setting_reloads_and_a_per_request_one_is_hot() -> None:
    before = config(a={}, b={}, c={})
    after = config(
        a={"options": {"prefix": "x"}},
        b={"description": "new", "sampling": {"temperature": 0.2}, "aliases": ["bee"],
           "max_queue_per_key": 2, "priority_aging_s": 5.0},  # the queue's settings: read per request
        c={"description": "new", "replicas": 2},  # one reloading field makes the whole change a reload
    )
    diff = diff_configs(before, after)
    assert diff.reloading == (ModelChange("a", ("options",)), ModelChange("c", ("description", "replicas")))
    assert diff.hot == (
        ModelChange("b", ("aliases", "description", "max_queue_per_key", "priority_aging_s", "sampling")),
    )
    assert diff.unchanged == 0


def test_every_hot_field_is_a_model_field() -> None:
    assert set(ModelConfig.model_fields) >= HOT_MODEL_FIELDS
    assert not {"backend", "source", "options", "tasks", "replicas"} & HOT_MODEL_FIELDS


def test_server_settings_need_a_restart_and_keys_apply_live() -> None:
    before = config(a={})
    after = validate_config({
        **before.model_dump(mode="json"),
        "server": {"port": 9001, "cors_origins": ["http://x.test"]},
        "pool": {"reap_interval_s": 5},
        "auth": {"keys": [{"name": "k", "sha256": "0" * 64}]},
        "defaults": {"models": {"embedding": "a"}},
    })
    diff = diff_configs(before, after)
    assert diff.needs_restart == ("pool.reap_interval_s", "server.cors_origins", "server.port")
    assert diff.live == ("auth.keys", "defaults.models")
    assert diff.unchanged == 1 and not (diff.added or diff.removed or diff.reloading or diff.hot)


def test_a_model_leaving_enabled_models_is_removed() -> None:
    both = config(a={}, b={})
    narrowed = validate_config({**both.model_dump(mode="json"), "enabled_models": ["a"]})
    assert diff_configs(both, narrowed).removed == ("b",)
