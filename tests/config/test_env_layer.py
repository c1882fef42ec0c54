"""Config from the environment reads only real config paths: the cases of issue 29 (a key
variable named by `key_env`, the CLI's and the services' own variables, the tests'
switches, model ids with capitals, dashes and dots)."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
import yaml

from modelpool.config import load_config
from modelpool.config.env_paths import RESERVED_ENV_NAMES, config_path, is_reserved, model_id_for, unread_names
from modelpool.config.loader import env_layer
from modelpool.errors import ConfigError

SRC = Path(__file__).resolve().parents[2] / "src" / "modelpool"


def write(path: Path, data: object) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


def test_the_readme_key_env_example_starts(tmp_path: Path) -> None:
    """`auth.keys[].key_env: MODELPOOL_APP_KEY` with the key exported: the variable holds
    a key, not config, and must not stop the start (it did: `app_key: Extra inputs`)."""
    config_file = write(tmp_path / "c.yaml", {"auth": {"keys": [{"name": "app", "key_env": "MODELPOOL_APP_KEY"}]}})
    config = load_config(config_file, environ={"MODELPOOL_APP_KEY": "sk-app-123"})
    assert config.auth.keys[0].key_env == "MODELPOOL_APP_KEY"
    assert "sk-app-123" not in repr(config.model_dump())


@pytest.mark.parametrize(
    "name",
    ["MODELPOOL_URL", "MODELPOOL_API_KEY", "MODELPOOL_STACK", "MODELPOOL_TEST_VLLM", "MODELPOOL_STATE_DIR",
     "MODELPOOL_UI_SCREENSHOTS", "MODELPOOL_CONFIG", "MODELPOOL_LOCAL_CONFIG"],
)  # fmt: skip
def test_the_cli_sdk_service_and_test_variables_are_not_config(name: str, tmp_path: Path) -> None:
    value = str(tmp_path / "x.yaml") if name.endswith("CONFIG") else "http://127.0.0.1:9/"
    if name.endswith("CONFIG"):
        write(tmp_path / "x.yaml", {})
    assert env_layer({name: value}) == {}
    assert is_reserved(name)
    load_config(environ={name: value})  # starts: no "Extra inputs are not permitted"


def test_only_real_config_paths_are_read() -> None:
    environ = {
        "MODELPOOL_SERVER__PORT": "8123",
        "MODELPOOL_SERVER__PROT": "1",  # a typo: no such field
        "MODELPOOL_SERVER__PORT__DEEPER": "1",  # below a scalar
        "MODELPOOL_POOL": "x",  # a section as a whole from a variable is still a path: read
        "MODELPOOL_APP_KEY": "sk-secret",
        "MODELPOOL_": "x",
        "MODELPOOL_MODELS__M__OPTIONS__N_CTX": "512",  # under a mapping any key goes
        "MODELPOOL_MODELS__M__NOT_A_FIELD": "1",
        "MODELPOOL_RAY__GROUPS__G__AUTOSCALING__MIN_REPLICAS": "1",  # through `X | None`
    }
    layer = env_layer(environ)
    assert layer == {
        "server": {"port": 8123},
        "pool": "x",
        "models": {"m": {"options": {"n_ctx": 512}}},
        "ray": {"groups": {"g": {"autoscaling": {"min_replicas": 1}}}},
    }
    assert unread_names(environ) == [
        "MODELPOOL_",
        "MODELPOOL_APP_KEY",
        "MODELPOOL_MODELS__M__NOT_A_FIELD",
        "MODELPOOL_SERVER__PORT__DEEPER",
        "MODELPOOL_SERVER__PROT",
    ]


def test_ignored_names_are_logged_at_debug_without_their_values(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="modelpool.config"):
        env_layer({"MODELPOOL_APP_KEY": "sk-very-secret", "MODELPOOL_URL": "http://x"})
    lines = [r for r in caplog.records if "MODELPOOL_APP_KEY" in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelno == logging.DEBUG
    assert "sk-very-secret" not in caplog.text
    assert "MODELPOOL_URL" not in caplog.text  # reserved: known, not "ignored"


def test_model_ids_with_capitals_dashes_and_dots_are_reachable(tmp_path: Path) -> None:
    config_file = write(
        tmp_path / "c.yaml",
        {"models": {"Qwen2.5-0.5B-Instruct": {"backend": "llama_cpp", "source": "/w.gguf", "preload": True}}},
    )
    environ = {
        "MODELPOOL_MODELS__QWEN2_5_0_5B_INSTRUCT__PRELOAD": "false",
        "MODELPOOL_MODELS__qwen2_5_0_5b_instruct__KEEP_ALIVE": "5m",
        "MODELPOOL_MODELS__WHISPER_TINY_EN__PRELOAD": "true",  # a starter: whisper-tiny.en
        "MODELPOOL_MODELS__SMOLLM2-135M-INSTRUCT-HF__PRELOAD": "true",  # the id as it is (not a shell name)
    }
    config = load_config(config_file, environ=environ)
    assert config.models["Qwen2.5-0.5B-Instruct"].preload is False
    assert config.models["Qwen2.5-0.5B-Instruct"].keep_alive is not None
    assert config.models["whisper-tiny.en"].preload is True
    assert config.models["smollm2-135m-instruct-hf"].preload is True
    assert "qwen2_5_0_5b_instruct" not in config.models and "whisper_tiny_en" not in config.models


def test_an_id_segment_that_fits_two_ids_is_an_error_naming_both() -> None:
    with pytest.raises(ConfigError) as caught:
        model_id_for("MY_MODEL", ["my-model", "My.Model", "other"])
    assert "My.Model" in caught.value.message and "my-model" in caught.value.message


def test_a_segment_no_id_matches_adds_a_model() -> None:
    assert config_path("MODELPOOL_MODELS__NEW_ONE__BACKEND", ["smollm2-135m-instruct"]) == [
        "models",
        "new_one",
        "backend",
    ]


def test_every_modelpool_variable_the_code_reads_is_reserved() -> None:
    """A name modelpool reads for itself (a typer envvar, an os.environ lookup, a constant)
    must be reserved here, or it would also be taken as config."""
    read = set()
    pattern = re.compile(r"""(?:envvar=|environ\.get\(|_ENV = )["'](MODELPOOL_[A-Z0-9_]+)["']""")
    for path in SRC.rglob("*.py"):
        read |= set(pattern.findall(path.read_text()))
    assert {"MODELPOOL_URL", "MODELPOOL_API_KEY", "MODELPOOL_STATE_DIR", "MODELPOOL_STACK"} <= read
    assert read <= RESERVED_ENV_NAMES
