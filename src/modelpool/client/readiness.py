"""wait_ready: poll a server until it can serve the endpoint's model.

Servers disagree on where readiness lives, so the probe walks a chain and a 404 moves on:
modelpool's `/readyz?model=NAME` (200 also when the model would load on demand), then
llama-server/vLLM's `/health`, then `/v1/models` (anything OpenAI-shaped). While the
answer says "not yet" — 503 `model_not_ready`, any other 503 or 502, a refused connection
— it sleeps a little and asks again; a model that failed to load raises at once, since
waiting will not fix it. Other errors (a bad key, an unknown model) also raise at once.
"""

from __future__ import annotations

import asyncio
import time

import httpx

from modelpool.client.errors import (
    ClientError,
    ConnectionFailed,
    ModelLoadError,
    ReadyTimeout,
    error_from_response,
)
from modelpool.client.transport import Transport

RETRY_STATUSES = frozenset({502, 503, 504})
PARAMETERISED_PATHS = frozenset({"/readyz"})
"""Paths that take `?model=` (modelpool's readiness of one model)."""


class ReadinessProbe:
    def __init__(self, transport: Transport, paths: tuple[str, ...], model: str, poll_s: float = 0.25) -> None:
        self._transport = transport
        self._paths = list(paths)
        self._model = model
        self._poll_s = poll_s
        self._last: tuple[int | None, str | None, str] = (None, None, "no answer yet")

    async def wait(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not await self._ready_once():
            left = deadline - time.monotonic()
            if left <= 0:
                status, code, said = self._last
                what = f" for '{self._model}'" if self._model else ""
                raise ReadyTimeout(
                    f"{self._transport.base_url} not ready{what} after {timeout_s:g}s; last: {said}",
                    last_status=status,
                    last_code=code,
                )
            await asyncio.sleep(min(self._poll_s, left))

    async def _ready_once(self) -> bool:
        """True when ready; False to try again; raises what waiting cannot fix."""
        while True:
            path = self._paths[0]
            try:
                response = await self._transport.get(path, self._params(path))
            except ConnectionFailed as exc:
                self._last = (None, None, exc.message)
                return False
            if response.status_code < 400:
                return True
            error = error_from_response(response)
            if response.status_code == 404 and error.code != "model_not_found" and len(self._paths) > 1:
                self._paths.pop(0)  # no such route here: the next one in the chain
                continue
            return self._judge(path, response, error)

    def _judge(self, path: str, response: httpx.Response, error: ClientError) -> bool:
        if isinstance(error, ModelLoadError) or response.status_code not in RETRY_STATUSES:
            raise error
        self._last = (response.status_code, error.code, f"GET {path} → {response.status_code}: {error.message}")
        return False

    def _params(self, path: str) -> dict[str, str] | None:
        return {"model": self._model} if path in PARAMETERISED_PATHS and self._model else None
