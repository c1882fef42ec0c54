"""`send` on Python 3.10's asyncio, and the run's clients sharing one TLS context."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Coroutine
from types import SimpleNamespace
from typing import Any

import pytest

from modelpool.loadgen import LoadSpec, requests
from modelpool.loadgen.records import RequestRecord
from modelpool.loadgen.runner import open_client


class Py310TimeoutError(Exception):
    """Python 3.10's `asyncio.TimeoutError`: its own class, not the builtin `TimeoutError`
    (they became one in 3.11, where the tests run)."""


async def wait_for_as_on_py310(awaitable: Coroutine[Any, Any, None], timeout: float) -> None:
    awaitable.close()  # never started: the request timed out before its reply
    raise Py310TimeoutError


async def test_a_timeout_raised_as_python_310s_asyncio_does_is_counted_not_raised(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    py310 = SimpleNamespace(wait_for=wait_for_as_on_py310, TimeoutError=Py310TimeoutError)
    monkeypatch.setattr(requests, "asyncio", py310)  # the asyncio `send` sees is 3.10's
    spec = LoadSpec("http://127.0.0.1:9", "m", timeout_s=0.5)
    async with open_client(spec, 1) as clients:
        record = await requests.send(clients.slot(0), spec, "hi", RequestRecord(0, 1))
    assert record.error == "timeout"
    assert asyncio.TimeoutError is TimeoutError  # on 3.11+ the stand-in above is the only way to test this


def test_the_clients_of_a_run_share_one_tls_context(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[ssl.SSLContext] = []
    create = ssl.create_default_context

    def counted(*args: Any, **kwargs: Any) -> ssl.SSLContext:
        made.append(create(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(ssl, "create_default_context", counted)

    async def open_many() -> None:
        async with open_client(LoadSpec("https://api.example.com", "m"), 16) as clients:
            assert len({id(clients.slot(n)) for n in range(16)}) == 16  # still a client per slot

    asyncio.run(open_many())
    assert len(made) == 1  # one context (CA bundle parsed once), not one per connection
    assert made[0].verify_mode == ssl.CERT_REQUIRED and made[0].check_hostname  # still verifying
