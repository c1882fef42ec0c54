"""`make test`'s early build of the container tests' images (tests/containers/prebuild.py):
it builds each image the tests build, under its own names, and never fails the run itself."""

from __future__ import annotations

import fcntl
import subprocess
import sys
from pathlib import Path

import pytest

from tests.containers import host as host_module
from tests.containers import prebuild
from tests.containers.host import PREBUILT, REPO, ContainerHost


class _Recording(ContainerHost):
    """Records the builds asked for instead of running them; the ray build fails."""

    def __init__(self) -> None:
        super().__init__(cli="podman", env={}, base_image="localhost/base")
        self.built: list[tuple[str, str]] = []

    def build_target(self, tag: str, target: str) -> float:
        if target == "ray":
            raise AssertionError("podman build failed:\nno space left on device")
        self.built.append((tag, target))
        return 1.0

    def build_engine_image(self, tag: str, context: Path) -> float:
        self.built.append((tag, context.name))
        return 2.0


def test_each_image_is_built_under_its_prebuilt_name_and_a_failure_is_reported_not_raised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    host = _Recording()
    monkeypatch.setattr(prebuild, "find_container_host", lambda: host)
    monkeypatch.setattr(prebuild, "PREBUILD_LOCK", tmp_path / "prebuild.lock")  # not the real one
    assert prebuild.main([]) == 0
    assert [tag for tag, _ in host.built] == [f"{PREBUILT}:image", f"{PREBUILT}:llama"]
    assert host.built[0][1] == "image"
    said = capsys.readouterr().out
    assert f"{PREBUILT}:ray not built ahead" in said and "no space left on device" in said
    assert f"{PREBUILT}:image built in 1 s" in said


def test_without_a_container_runtime_it_says_why_and_succeeds() -> None:
    """Run as `make test` runs it (the standard library only, before the project installs),
    with no runtime on PATH."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.containers.prebuild"], cwd=REPO, capture_output=True, text=True,
        env={"PATH": "/nonexistent", "MODELPOOL_TEST_CONTAINER_CLI": "podman"}, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "no images built ahead: no `podman` on PATH" in done.stdout


def test_in_the_background_make_goes_on_at_once_and_a_test_waits_for_the_builds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a stand-in runtime whose builds last until the test lets them end: the command
    `make test` starts returns while they build, the lock is held meanwhile, and once they
    end `make test`'s `--wait` returns and the log has all three."""
    release, lock, log = tmp_path / "release", tmp_path / "prebuild.lock", tmp_path / "prebuild.log"
    runtime = tmp_path / "podman"
    runtime.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = build ]; then while [ ! -e "$RELEASE" ]; do sleep 0.05; done; fi\n'
        'if [ "$1" = image ]; then echo 1; fi\n'
    )
    runtime.chmod(0o755)
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "RELEASE": str(release), "MODELPOOL_TEST_PREBUILD_LOCK": str(lock)}
    done = subprocess.run(
        [sys.executable, "-m", "tests.containers.prebuild", "--background", str(log)],
        cwd=REPO, capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "in the background" in done.stdout
    with lock.open("a") as held, pytest.raises(BlockingIOError):
        fcntl.flock(held, fcntl.LOCK_SH | fcntl.LOCK_NB)  # the builds hold it
    release.touch()
    waited = subprocess.run(  # as `make test` waits before the tests
        [sys.executable, "-m", "tests.containers.prebuild", "--wait"], cwd=REPO, env=env, timeout=60
    )
    assert waited.returncode == 0
    monkeypatch.setattr(host_module, "PREBUILD_LOCK", lock)
    host_module.wait_for_prebuild()  # a container test's fixture: the lock is free at once now
    said = log.read_text()
    assert all(f"{PREBUILT}:{name} built in" in said for name in ("image", "ray", "llama")), said
