"""Where models.yaml keys come from besides the environment (fast, no server): a `.env`
beside the file (never over a real variable), the saved credentials file (only when
private), the agent sample's own cache, and the worker-side `model_backend` switch that
picks `models.nim.yaml`."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from modelpool.client import ConfigError, load_models_config, load_worker_models, models_file_of
from modelpool.client.credentials import read_dotenv, save_credential, saved_credentials

KEY = "nvapi-unit-8a2b-never-print-me"
ENTRY = "vlm:\n  kind: openai_compat\n  category: vlm\n  base_url: http://127.0.0.1:9\n  model_name: m\n" \
        "  api_key_env: NGC_API_KEY\n  health_check: false\n"  # fmt: skip


@pytest.fixture(autouse=True)
def private_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No real key or credentials file of the machine's leaks in (HOME for the sample's cache)."""
    monkeypatch.delenv("NGC_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("MODELPOOL_CREDENTIALS", str(tmp_path / "cred" / "credentials.json"))
    monkeypatch.chdir(tmp_path)


def _models(folder: Path, text: str = ENTRY) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "models.yaml").write_text(text)
    return folder / "models.yaml"


def test_dotenv_lines_quotes_exports_and_comments(tmp_path: Path) -> None:
    path = tmp_path / "x.env"
    path.write_text("# comment\n\nA=1\nexport B = 'two words'\nC=\"q\"\nD=plain # trailing\nE=\n")
    assert read_dotenv(path) == {"A": "1", "B": "two words", "C": "q", "D": "plain", "E": ""}
    path.write_text(f"A=1\n{KEY}\n")
    with pytest.raises(ConfigError) as caught:
        read_dotenv(path)
    assert "line 2 is not NAME=value" in caught.value.message and KEY not in caught.value.message


def test_the_key_comes_from_dotenv_beside_the_file_but_never_over_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    models = _models(tmp_path / "sample")
    (tmp_path / "sample" / ".env").write_text(f"NGC_API_KEY={KEY}\n")
    assert load_models_config(models).endpoint("vlm").api_key == KEY
    monkeypatch.setenv("NGC_API_KEY", "from-the-environment")
    assert load_models_config(models).endpoint("vlm").api_key == "from-the-environment"


def test_a_saved_key_is_used_and_a_readable_file_refused(tmp_path: Path) -> None:
    models = _models(tmp_path / "sample")
    with pytest.raises(ConfigError, match="modelpool credentials set NGC_API_KEY"):
        load_models_config(models)
    path = save_credential("NGC_API_KEY", KEY)
    assert load_models_config(models).endpoint("vlm").api_key == KEY
    path.chmod(0o640)
    with pytest.raises(ConfigError, match=r"mode 0640\): run `chmod 600"):
        load_models_config(models)


def test_the_samples_own_credentials_cache_is_read(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cache = tmp_path / "home" / ".config" / "xr-ai" / "credentials.json"
    cache.parent.mkdir(parents=True)
    cache.write_text(f'{{"NGC_API_KEY": "{KEY}"}}')
    cache.chmod(0o600)
    assert saved_credentials() == {"NGC_API_KEY": KEY}
    assert load_models_config(_models(tmp_path / "sample")).endpoint("vlm").api_key == KEY
    cache.chmod(0o644)  # as the sample's launcher leaves it: skipped with a warning, never fatal
    with caplog.at_level(logging.WARNING):
        assert saved_credentials() == {}
    assert "chmod 600" in caplog.text and KEY not in caplog.text


@pytest.mark.parametrize(("worker", "chosen"), [
    ("model_backend: nim\n", "models.nim.yaml"),
    ("model_backend: NIM\nmodels_yaml: custom.yaml\n", "models.nim.yaml"),
    ("models_yaml: custom.yaml\n", "custom.yaml"),
    ("system_prompt: hi\n", "models.yaml"),
])  # fmt: skip
def test_model_backend_picks_the_models_file_as_the_sample_worker_does(
    tmp_path: Path, worker: str, chosen: str
) -> None:
    (tmp_path / "worker.yaml").write_text(worker)
    assert models_file_of(tmp_path / "worker.yaml") == tmp_path / chosen


def test_the_nim_overlay_loads_through_the_worker_config(tmp_path: Path) -> None:
    folder = tmp_path / "yaml"
    _models(folder, "vlm:\n  kind: preset:cosmos_vlm\n  base_url: http://localhost:8100\n")
    (folder / "models.nim.yaml").write_text(ENTRY)
    (folder / ".env").write_text(f"NGC_API_KEY={KEY}\n")
    (folder / "worker.yaml").write_text("model_backend: nim\n")
    assert load_worker_models(folder / "worker.yaml").endpoint("vlm").model_name == "m"
    (folder / "worker.yaml").write_text("model_backend: local\n")
    assert load_worker_models(folder / "worker.yaml").endpoint("vlm").model_name == "vlm"
    (folder / "worker.yaml").write_text("model_backend: '../../etc'\n")
    with pytest.raises(ConfigError, match="may hold only"):
        models_file_of(folder / "worker.yaml")
