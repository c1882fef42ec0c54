from __future__ import annotations

from collections.abc import Iterator

import pytest

from modelpool.services.container_argv import Runtime, runtime_candidates
from tests.containers.host import ContainerHost


@pytest.fixture
def runtime(container_host: ContainerHost, monkeypatch: pytest.MonkeyPatch) -> Runtime:
    """The runtime modelpool's code calls, with what its client needs here in the environment
    (as modelpool's own would have it)."""
    if "CONTAINERS_CONF" in container_host.env:
        monkeypatch.setenv("CONTAINERS_CONF", container_host.env["CONTAINERS_CONF"])
    return runtime_candidates(container_host.cli)[0]


@pytest.fixture
def names(container_host: ContainerHost) -> Iterator[list[str]]:
    """Container names for this test; whatever is left of them is removed at its end."""
    made: list[str] = []
    yield made
    for name in made:
        container_host.remove_container(name)
