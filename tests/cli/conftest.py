from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def keep_logging_as_it_was() -> Iterator[None]:
    """`serve` configures logging onto the runner's captured stderr, which closes after the
    command; put the handlers back so later log lines do not go to a closed stream."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
