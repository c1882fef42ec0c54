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

HERE = Path(__file__).parent
NODE_LOSS = HERE / "test_node_loss.py"


@pytest.fixture(scope="package")  # torn down when this folder's tests are done
def ray_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayModelpool]:
    yield from start(Path(tmp_path_factory.mktemp("ray")))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The node-loss tests take nodes away from the shared cluster: they run after every
    other test of this folder (file order alone would put them before test_ray_mode.py)."""
    losing = [item for item in items if item.path == NODE_LOSS]
    rest = [item for item in items if item.path != NODE_LOSS]
    ours = [index for index, item in enumerate(rest) if item.path.parent == HERE]
    at = ours[-1] + 1 if ours else len(rest)
    items[:] = rest[:at] + losing + rest[at:]
