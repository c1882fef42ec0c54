"""Where models.yaml keys come from besides the environment (fast, no server): a `.env`
beside the file (never over a real variable), the saved credentials file (only when
private), the agent sample's own cache, and the worker-side `model_backend` switch that
picks `models.nim.yaml`."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import pytest

from modelpool.client import ConfigError, load_models_config, load_worker_models, models_file_of
from modelpool.client.credentials import credentials_file, read_dotenv, save_credential, saved_credentials

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


NO_KEY = "llm:\n  kind: openai_compat\n  base_url: http://127.0.0.1:9\n  model_name: m\n  health_check: false\n"
# chmod 000 does not stop root: the permission assertions only mean something for another user.
AS_ROOT = os.geteuid() == 0


def _models(folder: Path, text: str = ENTRY) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "models.yaml").write_text(text)
    return folder / "models.yaml"


def test_dotenv_lines_quotes_exports_and_comments(tmp_path: Path) -> None:
    path = tmp_path / "x.env"
    path.write_text("# comment\n\nA=1\nexport B = 'two words'\nC=\"q\"\nD=plain # trailing\nE=\n")
    assert read_dotenv(path) == {"A": "1", "B": "two words", "C": "q", "D": "plain", "E": ""}


def test_a_malformed_dotenv_line_is_skipped_with_a_warning_naming_only_its_number(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "x.env"
    path.write_text(f"A=1\n{KEY}\nNGC_API_KEY: {KEY}\nB=2\n")  # a bare value, a YAML-style line: never guessed at
    with caplog.at_level(logging.WARNING):
        assert read_dotenv(path) == {"A": "1", "B": "2"}
    assert f"{path}: line 2 is not NAME=value; skipped" in caplog.text
    assert f"{path}: line 3 is not NAME=value; skipped" in caplog.text and KEY not in caplog.text


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


def test_dotenv_and_saved_credentials_are_read_only_for_a_key_the_environment_lacks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / ".env").write_text(f"A=1\n{KEY}\n")  # in the working directory: every load would see it
    saved = credentials_file()
    saved.parent.mkdir(parents=True)
    saved.write_text("not JSON")
    saved.chmod(0o644)  # broken twice over: unreadable for the SDK, and readable by others
    with caplog.at_level(logging.WARNING):
        assert load_models_config(_models(tmp_path / "plain", NO_KEY)).endpoint("llm").api_key is None
        monkeypatch.setenv("NGC_API_KEY", "exported")
        assert load_models_config(_models(tmp_path / "exported")).endpoint("vlm").api_key == "exported"
    assert caplog.text == ""  # neither file was even opened
    monkeypatch.delenv("NGC_API_KEY")
    with pytest.raises(ConfigError) as caught:  # now the key must come from them: the problem names the file
        load_models_config(_models(tmp_path / "needed"))
    assert f"credentials file {saved}" in caught.value.message and "line 2 is not NAME=value" in caplog.text
    (tmp_path / "needed" / ".env").write_text(f"junk line\nNGC_API_KEY={KEY}\n")  # found before the saved file
    assert load_models_config(tmp_path / "needed" / "models.yaml").endpoint("vlm").api_key == KEY
    assert KEY not in caplog.text


@pytest.mark.skipif(AS_ROOT, reason="root reads a chmod 000 file anyway")
@pytest.mark.parametrize("locked", ["file", "folder"])
def test_an_unreadable_credentials_file_or_folder_is_a_config_error_naming_it(tmp_path: Path, locked: str) -> None:
    path = save_credential("NGC_API_KEY", KEY)
    target = path if locked == "file" else path.parent
    target.chmod(0o000)
    try:
        for call in (saved_credentials, lambda: load_models_config(_models(tmp_path / "sample")),
                     lambda: save_credential("OTHER", "v")):  # fmt: skip
            with pytest.raises(ConfigError) as caught:
                call()
            assert str(path) in caught.value.message and "Permission denied" in caught.value.message
            assert KEY not in caught.value.message
    finally:
        target.chmod(0o700)


@pytest.mark.skipif(AS_ROOT, reason="root writes into a read-only folder anyway")
def test_a_credentials_folder_that_cannot_be_written_is_a_config_error(tmp_path: Path) -> None:
    folder = tmp_path / "readonly"
    folder.mkdir(mode=0o500)
    with pytest.raises(ConfigError, match=f"cannot write credentials file {folder}/new/c.json: Permission denied"):
        save_credential("NGC_API_KEY", KEY, folder / "new" / "c.json")
    folder.chmod(0o700)


def test_every_folder_the_credentials_file_needs_is_created_private(tmp_path: Path) -> None:
    path = save_credential("NGC_API_KEY", KEY, tmp_path / "config" / "modelpool" / "c.json")
    for folder in (path.parent, path.parent.parent):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_permission_error_on_the_credentials_file_is_a_config_error_even_as_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The chmod tests above skip as root; this makes the file's stat fail as chmod 000 on
    its folder would, for any user."""
    path = save_credential("NGC_API_KEY", KEY)
    real_stat = Path.stat

    def denied(self: Path, *, follow_symlinks: bool = True) -> os.stat_result:
        if self == path:
            raise PermissionError(13, "Permission denied", str(self))
        return real_stat(self, follow_symlinks=follow_symlinks)

    monkeypatch.setattr(Path, "stat", denied)
    with pytest.raises(ConfigError, match=f"cannot read credentials file {path}: Permission denied"):
        load_models_config(_models(tmp_path / "sample"))


def test_files_that_are_not_utf8_text_are_config_errors(tmp_path: Path) -> None:
    (tmp_path / "models.yaml").write_bytes(b"vlm:\n  kind: \xff\xfe\n")
    with pytest.raises(ConfigError, match="is not UTF-8 text"):
        load_models_config(tmp_path / "models.yaml")
    (tmp_path / "worker.yaml").write_bytes(b"model_backend: \xff\n")
    with pytest.raises(ConfigError, match="is not UTF-8 text"):
        models_file_of(tmp_path / "worker.yaml")
    (tmp_path / ".env").write_bytes(b"NGC_API_KEY=\xff\n")
    with pytest.raises(ConfigError, match=r"cannot read \.env file .*\.env: UnicodeDecodeError"):
        load_models_config(_models(tmp_path / "sample"))
