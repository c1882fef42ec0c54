"""`adapters:` in the config: the shorthand, paths anchored at the config file, names and
scales checked at startup, and a backend that cannot serve adapters refused by name. The
pool's choice between a model id with `:` and `base:adapter` (an exact name wins)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from pydantic import ValidationError

from modelpool.backends.registry import model_capabilities
from modelpool.config import load_config
from modelpool.config.schema import Config, ModelConfig
from modelpool.errors import AdapterNotFound, ConfigError, InvalidRequest
from modelpool.runtime.adapters import split_adapter
from modelpool.runtime.slot import ModelSlot


def model(**fields: Any) -> dict[str, Any]:
    return {"backend": "llama_cpp", "source": "/models/base.gguf", **fields}


def test_shorthand_and_relative_paths_are_anchored_at_the_config_file(tmp_path: Path) -> None:
    (tmp_path / "modelpool.yaml").write_text(
        "starter_models: false\nmodels:\n  m:\n    backend: llama_cpp\n    source: /models/base.gguf\n"
        "    adapters:\n      pirate: adapters/pirate.gguf\n      poet: {source: hf:org/repo:poet.gguf, scale: 0.5}\n"
    )
    config = load_config(tmp_path / "modelpool.yaml", environ={})
    adapters = config.models["m"].adapters
    assert adapters["pirate"].source == str(tmp_path / "adapters" / "pirate.gguf")
    assert adapters["poet"].source == "hf:org/repo:poet.gguf" and adapters["poet"].scale == 0.5
    assert adapters["pirate"].scale == 1.0 and not adapters["pirate"].preload


@pytest.mark.parametrize("name", ["a:b", "../up", "with space", "", "x" * 65])
def test_a_bad_adapter_name_is_refused_naming_it(name: str) -> None:
    with pytest.raises(ValidationError, match="adapter name"):
        ModelConfig(id="m", **model(adapters={name: "/a.gguf"}))


@pytest.mark.parametrize("field", [{"scale": 9.0}, {"scale": -9.0}, {"source": ""}, {"path": "/a.gguf"}])
def test_out_of_bounds_adapter_settings_are_refused(field: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        ModelConfig(id="m", **model(adapters={"a": {"source": "/a.gguf", **field}}))


@pytest.mark.parametrize("max_adapters", [0, 65])
def test_max_adapters_is_bounded(max_adapters: int) -> None:
    with pytest.raises(ValidationError, match="max_adapters"):
        ModelConfig(id="m", **model(max_adapters=max_adapters))


def test_a_backend_without_adapters_is_refused_naming_the_model_and_backend() -> None:
    entry = ModelConfig.model_validate({"id": "emb", "backend": "sentence_transformers", "source": "/m",
                                        "adapters": {"a": {"source": "/a"}}})  # fmt: skip
    with pytest.raises(ConfigError, match=r"'emb'.*'sentence_transformers' cannot serve LoRA adapters"):
        model_capabilities(entry)
    assert model_capabilities(ModelConfig(id="m", **model(adapters={"a": {"source": "/a"}}))).as_json()["adapters"]


def test_transformers_serves_adapters_on_text_models_only() -> None:
    text = {"id": "hf", "backend": "transformers", "source": "/m", "adapters": {"a": {"source": "/a"}}}
    assert model_capabilities(ModelConfig.model_validate(text)).as_json()["adapters"]
    vision = ModelConfig.model_validate({**text, "options": {"vision": True}})
    with pytest.raises(ConfigError, match=r"'hf'.*'transformers' cannot serve LoRA adapters"):
        model_capabilities(vision)


def test_base_colon_adapter_may_not_be_another_models_name() -> None:
    models = {"m": model(adapters={"v2": "/a.gguf"}), "m:v2": model()}
    with pytest.raises(ValidationError, match="'m:v2' is used by both"):
        Config.model_validate({"starter_models": False, "models": models})


def slots(**adapters_of: list[str]) -> dict[str, ModelSlot]:
    made = {name: SimpleNamespace(id=name, config=SimpleNamespace(adapters=dict.fromkeys(names)))
            for name, names in adapters_of.items()}  # fmt: skip
    return cast(dict[str, ModelSlot], made)


def test_an_exact_model_name_wins_over_base_colon_adapter() -> None:
    names = {**slots(base=["v2"]), "base:v2": slots(other=[])["other"]}
    assert split_adapter(names, "base:v2", None) == ("base:v2", None)
    assert split_adapter(slots(base=["v2"]), "base:v2", None) == ("base", "v2")
    assert split_adapter(slots(base=["v2"]), "base", "v2") == ("base", "v2")
    assert split_adapter(slots(base=[]), "nobody:v2", None) == ("nobody:v2", None)  # the pool's 404 follows


def test_unknown_or_disagreeing_adapters_are_400s_naming_them() -> None:
    with pytest.raises(AdapterNotFound, match=r"no adapter 'v3' .*it has: v2"):
        split_adapter(slots(base=["v2"]), "base:v3", None)
    with pytest.raises(InvalidRequest, match="'v2' but `adapter` says 'v1'"):
        split_adapter(slots(base=["v1", "v2"]), "base:v2", "v1")
