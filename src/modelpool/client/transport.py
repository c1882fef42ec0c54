"""The HTTP side of every role client: one httpx.AsyncClient with the endpoint's base URL,
bearer key and timeouts, where every answer ≥ 400 and every transport failure becomes the
SDK's typed error, and server-sent events are parsed (an `error` event raises mid-stream).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import httpx

from modelpool.client.errors import ClientError, connection_failed, error_from_payload, error_from_response

Files = Mapping[str, tuple[str, bytes, str]]


class Transport:
    def __init__(self, base_url: str, *, api_key: str | None, timeout_s: float, connect_timeout_s: float) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        timeout = httpx.Timeout(timeout_s, connect=min(connect_timeout_s, timeout_s))
        self.base_url = base_url
        self._http = httpx.AsyncClient(base_url=base_url, headers=headers, timeout=timeout)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def get(self, path: str, params: Mapping[str, str] | None = None) -> httpx.Response:
        """The raw answer, whatever its status (readiness probes read 404s and 503s)."""
        return await self._send(self._http.build_request("GET", path, params=params))

    async def get_json(self, path: str) -> dict[str, Any]:
        return _json_or_raise(await self.get(path))

    async def post_json(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return _json_or_raise(await self._send(self._http.build_request("POST", path, json=body)))

    async def post_form(self, path: str, data: Mapping[str, str | list[str]], files: Files) -> dict[str, Any]:
        request = self._http.build_request("POST", path, data=dict(data), files=dict(files))
        return _json_or_raise(await self._send(request))

    async def post_bytes(self, path: str, body: Mapping[str, Any]) -> httpx.Response:
        response = await self._send(self._http.build_request("POST", path, json=body))
        if response.status_code >= 400:
            raise error_from_response(response)
        return response

    @asynccontextmanager
    async def stream(self, path: str, body: Mapping[str, Any]) -> AsyncIterator[httpx.Response]:
        """A streamed POST; an error status is raised (typed) before the body is handed over."""
        request = self._http.build_request("POST", path, json=body)
        try:
            response = await self._http.send(request, stream=True)
        except httpx.TransportError as exc:
            raise connection_failed(self.base_url, exc) from exc
        try:
            if response.status_code >= 400:
                await response.aread()
                raise error_from_response(response)
            yield response
        except httpx.TransportError as exc:  # the connection broke mid-stream
            raise connection_failed(self.base_url, exc) from exc
        finally:
            await response.aclose()

    async def _send(self, request: httpx.Request) -> httpx.Response:
        try:
            return await self._http.send(request)
        except httpx.TransportError as exc:
            raise connection_failed(self.base_url, exc) from exc


async def sse_events(response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    """The JSON events of a server-sent event stream, up to `[DONE]`; an event holding an
    `error` object raises it as the typed error (servers report mid-stream failures so)."""
    data: list[str] = []
    async for line in response.aiter_lines():
        if line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
            continue
        if line or not data:
            continue  # `event:`, `id:`, comments, or a blank line with nothing pending
        payload, data = "\n".join(data), []
        if payload.strip() == "[DONE]":
            return
        yield _event(payload)
    if data and "\n".join(data).strip() != "[DONE]":
        yield _event("\n".join(data))


def _event(payload: str) -> dict[str, Any]:
    try:
        event = json.loads(payload)
    except ValueError:
        raise ClientError(f"the server sent an event that is not JSON: {payload[:200]}") from None
    if not isinstance(event, dict):
        raise ClientError(f"the server sent an event that is not a JSON object: {payload[:200]}")
    if event.get("error"):
        raise error_from_payload(event)
    return event


def _json_or_raise(response: httpx.Response) -> dict[str, Any]:
    if response.status_code >= 400:
        raise error_from_response(response)
    try:
        body = response.json()
    except ValueError:
        raise ClientError(f"HTTP {response.status_code}: the answer is not JSON: {response.text[:200]}",
                          response.status_code) from None  # fmt: skip
    if not isinstance(body, dict):
        raise ClientError(f"HTTP {response.status_code}: expected a JSON object, got {type(body).__name__}",
                          response.status_code)  # fmt: skip
    return body
