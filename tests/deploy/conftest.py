from __future__ import annotations

from tests.containers.conftest import container_host  # noqa: F401  # the unit under a real systemd runs in a container
