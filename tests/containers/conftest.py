from __future__ import annotations

import pytest

from tests.containers.host import ContainerHost, find_container_host


@pytest.fixture(scope="session")
def container_host() -> ContainerHost:
    host = find_container_host()
    if isinstance(host, str):
        pytest.skip(host)
    return host
