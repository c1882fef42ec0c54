"""The container runtime the container tests build and run with: Podman (or Docker, with
MODELPOOL_TEST_CONTAINER_CLI=docker), `scripts/container_host.sh` having installed it and made
the local base image. Build arguments follow the conventions of the repository's Dockerfiles:
`BASE` (the base image), `PIP_CERT` (a CA bundle pip needs behind this machine's proxy) and
`PIP_FIND_LINKS` (folders of local wheels: the CPU torch wheel, the compiled llama-cpp-python),
each mounted into the build rather than copied into a layer."""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CONTAINERS_CONF = Path(__file__).with_name("containers.conf")
BASE_IMAGE = os.environ.get("MODELPOOL_TEST_BASE_IMAGE", "localhost/debian:bookworm-min")
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")
BUILD_TIMEOUT_S = 1800
ENGINE_IMAGE_DIR = Path(__file__).with_name("engine_image")
PREBUILD_LOCK = Path(
    os.environ.get("MODELPOOL_TEST_PREBUILD_LOCK")
    or Path(tempfile.gettempdir()) / f"modelpool-prebuild-{hashlib.sha256(bytes(REPO)).hexdigest()[:12]}.lock"
)
"""Held by tests/containers/prebuild.py while it builds (one per checkout)."""
PREBUILT = "localhost/modelpool-test-prebuilt"
"""`make test` builds the images the container tests build, under this name (`:image`,
`:ray`, `:llama`), while the venv installs (tests/containers/prebuild.py says why): the
tests' own builds then find every layer built. Each session fixture removes its tag too."""


@dataclass
class ContainerHost:
    cli: str
    """The runtime's command: `podman` or `docker`."""
    env: dict[str, str] = field(repr=False)
    """The environment every call gets (CONTAINERS_CONF for Podman's sandbox settings)."""
    base_image: str

    def run(self, *args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.cli, *args], env=self.env, capture_output=True, text=True, timeout=timeout, check=check
        )

    def build_args(self) -> list[str]:
        """`--build-arg`s and `-v` mounts for BASE, PIP_CERT and PIP_FIND_LINKS on this machine."""
        args = ["--build-arg", f"BASE={self.base_image}"]
        if HOST_CA.is_file():
            args += ["-v", f"{HOST_CA}:/run/host-ca.crt:ro", "--build-arg", "PIP_CERT=/run/host-ca.crt"]
        mounted = []
        for index, folder in enumerate(wheel_folders()):
            target = f"/run/wheels/{index}"
            args += ["-v", f"{folder}:{target}:ro"]
            mounted.append(target)
        if mounted:
            args += ["--build-arg", f"PIP_FIND_LINKS={' '.join(mounted)}"]
        return args

    def build(
        self, tag: str, *, dockerfile: Path | None = None, context: Path = REPO, extra: Sequence[str] = ()
    ) -> float:
        """Build `tag` (network: the host's, as containers.conf says); returns the seconds it took."""
        command = ["build", "--network", "host", "-t", tag, *self.build_args(), *extra]
        command += ["-f", str(dockerfile)] if dockerfile is not None else []
        started = time.monotonic()
        done = self.run(*command, str(context), timeout=BUILD_TIMEOUT_S, check=False)
        if done.returncode != 0:
            tail = "\n".join((done.stdout + done.stderr).splitlines()[-60:])
            raise AssertionError(f"{self.cli} {shlex.join(command)} failed:\n{tail}")
        return time.monotonic() - started

    def build_target(self, tag: str, target: str) -> float:
        """The repository's Dockerfile built up to `target` (image, ray), as `make image` does."""
        # Podman's default OCI format drops HEALTHCHECK; the Docker format keeps it (as `make image`).
        flags = ["--format", "docker"] if self.cli == "podman" else []
        return self.build(tag, extra=[*flags, "--target", target])

    def build_engine_image(self, tag: str, context: Path) -> float:
        """tests/containers/engine_image, built in `context` (its Dockerfile and the repository's
        constraints.txt: a context of two small files, not the repository)."""
        shutil.copy(ENGINE_IMAGE_DIR / "Dockerfile", context / "Dockerfile")
        shutil.copy(REPO / "constraints.txt", context / "constraints.txt")
        return self.build(tag, context=context)

    def remove_container(self, name: str) -> None:
        self.run("rm", "-f", "-t", "0", name, check=False)

    def remove_image(self, tag: str) -> None:
        self.run("rmi", "-f", tag, check=False)

    def image_bytes(self, tag: str) -> int:
        return int(self.run("image", "inspect", "--format", "{{.Size}}", tag).stdout.strip())


def wheel_folders() -> list[Path]:
    """pip's find-links folders on this machine (the CPU torch wheel) and the repository's
    compiled llama-cpp-python wheels (`.wheels/<key>/`, made by `make install`)."""
    folders: list[Path] = []
    listed = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=False
    ).stdout
    for line in listed.splitlines():
        name, _, value = line.partition("=")
        if name.endswith("find-links"):
            folders += [Path(p) for p in value.strip("'\"").split() if Path(p).is_dir()]
    folders += sorted(p for p in (REPO / ".wheels").glob("*") if p.is_dir())
    return list(dict.fromkeys(folders))


def wait_for_prebuild() -> None:
    """Return once `make test`'s early build of these images is over (at once if none runs):
    a test that built meanwhile would do the same work beside it instead of finding it done.
    The early build's own steps are bounded by BUILD_TIMEOUT_S each."""
    with PREBUILD_LOCK.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_SH)


def find_container_host() -> ContainerHost | str:
    """The host, or why there is none (the reason the container tests skip with)."""
    cli = os.environ.get("MODELPOOL_TEST_CONTAINER_CLI", "podman")
    if shutil.which(cli) is None:
        return f"no `{cli}` on PATH: run scripts/container_host.sh (make install-test does)"
    env = dict(os.environ)
    if cli == "podman":
        env.setdefault("CONTAINERS_CONF", str(CONTAINERS_CONF))
    host = ContainerHost(cli=cli, env=env, base_image=BASE_IMAGE)
    if host.run("image", "inspect", BASE_IMAGE, check=False).returncode != 0:
        return f"no base image {BASE_IMAGE}: run scripts/container_host.sh (make install-test does)"
    return host


def make_image_tag(target: str) -> str:
    """The tag `make <target>` (image, image-ray) gives its image: a dry run, nothing is built."""
    done = subprocess.run(
        ["make", "-s", "-n", target, "CONTAINER_CLI=docker"], cwd=REPO, capture_output=True, text=True, check=True
    )
    match = re.search(r" -t (\S+)", done.stdout)
    assert match, f"`make -n {target}` names no -t tag:\n{done.stdout}"
    return match.group(1)
