from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

# Before Ray is first imported: otherwise Ray swaps 127.0.0.1 for the host's external
# address and ray.init hangs (RAY.md).
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
pytest.importorskip("ray.serve", reason="Ray mode is optional: make install-ray")

from tests.ray_serve.cluster import RayModelpool, start


@pytest.fixture(scope="session")
def ray_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayModelpool]:
    yield from start(Path(tmp_path_factory.mktemp("ray")))
