"""The CLI's server-side verbs, run through typer's runner (no server is started)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from modelpool.cli.main import app

runner = CliRunner()


def write_config(folder: Path, data: dict[str, object]) -> Path:
    path = folder / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_models_lists_the_catalog_and_what_is_installed() -> None:
    result = runner.invoke(app, ["models"])
    assert result.exit_code == 0, result.output
    lines = {line.split()[0]: line.split() for line in result.output.splitlines()[1:] if line.strip()}
    assert lines["smollm2-135m-instruct"][1:5] == ["chat,completion,scoring", "llama_cpp", "yes", "yes"]
    assert lines["all-minilm-l6-v2"][1:5] == ["embedding", "sentence_transformers", "yes", "yes"]


def test_models_shows_install_hints_for_missing_models(tmp_path: Path) -> None:
    config = write_config(
        tmp_path,
        {
            "models": {
                "later": {
                    "backend": "llama_cpp",
                    "source": "package:not_installed_pkg/x.gguf",
                    "install_hint": "pip install it",
                }
            }
        },
    )
    result = runner.invoke(app, ["models", "--config", str(config)])
    assert result.exit_code == 0
    assert "later: pip install it" in result.output


def test_print_config_shows_the_effective_config_with_secrets_redacted(tmp_path: Path) -> None:
    config = write_config(
        tmp_path,
        {
            "models": {
                "all-minilm-l6-v2": {"options": {"device": "cpu"}},
                "x": {"backend": "llama_cpp", "source": "/w.gguf", "options": {"api_key": "sk-live-123"}},
            }
        },
    )
    result = runner.invoke(app, ["serve", "--config", str(config), "--port", "9999", "--models", "x", "--print-config"])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.output)
    assert shown["server"]["port"] == 9999 and shown["enabled_models"] == ["x"]
    assert shown["models"]["x"]["options"]["api_key"] == "***"
    assert "sk-live-123" not in result.output


def test_dry_run_loads_and_reports(tmp_path: Path) -> None:
    ok = runner.invoke(app, ["serve", "--models", "all-minilm-l6-v2", "--dry-run"])
    assert ok.exit_code == 0, ok.output
    assert "ok      all-minilm-l6-v2" in ok.output
    config = write_config(
        tmp_path,
        {
            "starter_models": False,
            "models": {"ghost": {"backend": "llama_cpp", "source": str(tmp_path / "missing.gguf")}},
        },
    )
    failed = runner.invoke(app, ["serve", "--config", str(config), "--dry-run"])
    assert failed.exit_code == 1
    assert "FAILED  ghost" in failed.output and "does not exist" in failed.output


def test_bad_config_exits_2_with_the_reason(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("server: {port: -1}")
    result = runner.invoke(app, ["serve", "--config", str(config), "--print-config"])
    assert result.exit_code == 2
    assert "server.port" in result.output


def test_bad_backend_options_fail_before_loading(tmp_path: Path) -> None:
    config = write_config(
        tmp_path,
        {
            "starter_models": False,
            "models": {"m": {"backend": "llama_cpp", "source": "/x.gguf", "options": {"n_ctxx": 5}}},
        },
    )
    result = runner.invoke(app, ["serve", "--config", str(config), "--dry-run"])
    assert result.exit_code == 2
    assert "invalid options for backend 'llama_cpp'" in result.output and "n_ctxx" in result.output


def test_no_keys_means_no_serving_beyond_loopback(tmp_path: Path) -> None:
    result = runner.invoke(app, ["serve", "--host", "0.0.0.0", "--port", "0", "--models", "all-minilm-l6-v2"])
    assert result.exit_code == 2
    assert "refusing to serve on 0.0.0.0 without API keys" in result.output


def test_a_key_whose_env_var_is_missing_stops_the_start(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"auth": {"keys": [{"name": "ci", "key_env": "MODELPOOL_TEST_UNSET_KEY"}]}})
    result = runner.invoke(app, ["serve", "--config", str(config), "--port", "0"], env={})
    assert result.exit_code == 2
    assert "$MODELPOOL_TEST_UNSET_KEY, which is not set" in result.output


def test_keyless_serving_beyond_loopback_when_allowed_is_said_out_loud(caplog: pytest.LogCaptureFixture) -> None:
    """The container image allows it by default (so `docker run -p ...` answers): the start
    says what that opens; on loopback, or with keys, nothing is said."""
    from modelpool.config import load_config
    from modelpool.server.auth import KeyRing, check_exposure

    allowed = load_config(
        cli={"server": {"host": "0.0.0.0"}, "auth": {"allow_unauthenticated_remote": True}}, environ={}
    )
    with caplog.at_level("WARNING", logger="modelpool"):
        check_exposure(allowed, KeyRing.from_config(allowed.auth, {}))
    assert [r.getMessage() for r in caplog.records] == [
        "serving with no API keys on a non-loopback address: anyone who can reach it can use, load and unload "
        "every model (configure auth.keys)"
    ]
    caplog.clear()
    loopback = load_config(cli={"auth": {"allow_unauthenticated_remote": True}}, environ={})
    check_exposure(loopback, KeyRing.from_config(loopback.auth, {}))
    assert caplog.records == []
