"""Print the constraints file for the environment this Python runs in: every installed
distribution pinned to its exact version (`make lock` runs it in a fresh, unconstrained
install; `tests/packaging/test_constraints.py` runs it in the test venv and compares).

Left out, on purpose: modelpool itself, and torch (installed first from TORCH_SPEC: the
CPU wheel here, the CUDA build on a GPU machine; a pin would fight that choice).
"""

from __future__ import annotations

import importlib.metadata
import re
import sysconfig

UNPINNED = {"modelpool", "torch"}
HEADER = """\
# What `make install`, `make install-test` and CI install: the exact versions the last green
# `make test` ran with. Every pip install in the Makefile uses it (`-c constraints.txt`), so a
# new release of any dependency cannot change CI between two stops.
# Move it forward on purpose: `make lock` (a fresh venv without constraints, then this freeze),
# then `make test`, and commit both. Not pinned here: torch (TORCH_SPEC) and modelpool itself.
"""


def canonical(name: str) -> str:
    """PEP 503's normalized name (`Llama_CPP.python` → `llama-cpp-python`)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pins() -> dict[str, str]:
    """Installed distribution → its version, by canonical name (torch and modelpool left out)."""
    found: dict[str, str] = {}
    # Only what pip installed into this environment: Ray puts its vendored packages
    # (ray/thirdparty_files) on sys.path once imported, and they are not ours to pin.
    site = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    for dist in importlib.metadata.distributions(path=site):
        name = canonical(dist.metadata["Name"])
        if name not in UNPINNED:
            found[name] = dist.version
    return found


def render(pinned: dict[str, str]) -> str:
    return HEADER + "".join(f"{name}=={version}\n" for name, version in sorted(pinned.items()))


if __name__ == "__main__":
    print(render(pins()), end="")
