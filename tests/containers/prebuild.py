"""The images the container tests build (the modelpool image, its Ray variant, the engine
image), built ahead under `host.PREBUILT` names: `make test` starts this in the background
(`--background LOG`) once llama-cpp-python's wheel is built (the builds install it from
there) and goes on with the install; before the tests start it waits for the builds to end
(`--wait`: they hold a lock), because timing-bound tests that ran beside them failed (two
abuse tests' 10 s bounds, measured once). A container test run on its own waits the same way
(`host.wait_for_prebuild`) if a build is still going.

Why: the suite keeps both cores busy from its first test to its last (2-3% idle, sampled
every 10 s), and these builds took ~7 of its CPU-minutes (the image ~300 s, the Ray layer
~100 s, the engine image ~40 s); the install's last pip steps run one at a time and leave a
core to spare. The tests still build every image themselves, with the same arguments: the
runtime's layer cache hands them what was built here, and a change since (a source file
edited in between) is simply built again.

Standard library only: it runs before the project is installed. A machine without a
container runtime, or a build that fails, is reported and left to the tests (which skip
or fail with the reason); this never fails `make test` by itself."""

from __future__ import annotations

import fcntl
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from tests.containers.host import PREBUILD_LOCK, PREBUILT, ContainerHost, find_container_host, wait_for_prebuild


def main(args: list[str]) -> int:
    if args[:1] == ["--wait"]:  # `make test`, before the tests: the builds never run beside them
        wait_for_prebuild()
        return 0
    host = find_container_host()
    if isinstance(host, str):
        print(f"prebuild: no images built ahead: {host}")
        return 0
    with PREBUILD_LOCK.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # taken before `make` goes on: no test can miss it
        if args[:1] == ["--background"]:
            print(f"prebuild: building the container tests' images in the background (log: {args[1]})", flush=True)
            if os.fork():
                return 0  # the child holds the lock (the same open file) until its builds are over
            _detach(args[1])
        _build_all(host)
    return 0


def _detach(log: str) -> None:
    """A session of its own, reading nothing and writing to `log`: not make's output, so
    nothing waits on this process's pipes."""
    os.setsid()
    with open(os.devnull) as nothing:
        os.dup2(nothing.fileno(), sys.stdin.fileno())
    with open(log, "w") as out:
        os.dup2(out.fileno(), sys.stdout.fileno())
        os.dup2(out.fileno(), sys.stderr.fileno())


def _build_all(host: ContainerHost) -> None:
    def engine_image(tag: str) -> float:
        with tempfile.TemporaryDirectory() as context:
            return host.build_engine_image(tag, Path(context))

    builds: tuple[tuple[str, Callable[[str], float]], ...] = (
        ("image", lambda tag: host.build_target(tag, "image")),
        ("ray", lambda tag: host.build_target(tag, "ray")),
        ("llama", engine_image),
    )
    for name, build in builds:
        tag = f"{PREBUILT}:{name}"
        try:
            print(f"prebuild: {tag} built in {build(tag):.0f} s", flush=True)
        except Exception as exc:  # the tests build it again and report the failure in full
            print(f"prebuild: {tag} not built ahead: {str(exc)[-2000:]}", flush=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
