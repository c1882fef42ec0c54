"""What every role client shares: its endpoint, one HTTP transport, readiness, closing,
and request bodies built the same way (endpoint extras < call fields < call extras)."""

from __future__ import annotations

from collections.abc import Mapping
from types import TracebackType
from typing import Any, ClassVar

from typing_extensions import Self

from modelpool.client.config import Endpoint
from modelpool.client.presets import Role
from modelpool.client.readiness import ReadinessProbe
from modelpool.client.transport import Transport


class RoleClient:
    kind: ClassVar[Role]
    also: ClassVar[tuple[Role, ...]] = ()
    """Other presets' kinds this client serves (an embedder reranks too)."""

    def __init__(self, endpoint: Endpoint, base_url: str) -> None:
        self.endpoint = endpoint
        self.base_url = base_url
        self._transport = Transport(
            base_url,
            api_key=endpoint.api_key,
            timeout_s=endpoint.timeout_s,
            connect_timeout_s=endpoint.connect_timeout_s,
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}(role={self.endpoint.role!r}, model={self.model!r}, base_url={self.base_url!r})"

    @property
    def model(self) -> str:
        """The model name sent with every request."""
        return self.endpoint.model_name

    async def wait_ready(self, timeout_s: float = 120.0, *, poll_s: float = 0.25) -> None:
        """Return once the server can serve this model (see readiness.py); at once when the
        endpoint says `health_check: false`. Raises ReadyTimeout, or ModelLoadError at once."""
        if not self.endpoint.health_check:
            return
        await ReadinessProbe(self._transport, self.endpoint.health_paths, self.model, poll_s).wait(timeout_s)

    async def aclose(self) -> None:
        await self._transport.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    def _body(self, fields: Mapping[str, Any], extra_body: Mapping[str, Any] | None) -> dict[str, Any]:
        """The request body: the endpoint's extra_body, then the call's fields (None = unsent),
        then the call's extra_body; mappings (chat_template_kwargs) merge one level deep."""
        body: dict[str, Any] = {}
        for layer in (self.endpoint.extra_body, {"model": self.model, **fields}, extra_body or {}):
            for key, value in layer.items():
                if value is None:
                    continue
                if isinstance(value, Mapping) and isinstance(body.get(key), Mapping):
                    value = {**body[key], **value}
                body[key] = value
        return body
