"""A small synchronous client of the admin API (used by `modelpool ps/load/unload`).
Its errors are the SDK's typed exceptions (all `ClientError`), mapped as everywhere else."""

from __future__ import annotations

from typing import Any

import httpx

from modelpool.client.errors import ClientError, connection_failed, error_from_response

__all__ = ["DEFAULT_URL", "AdminClient", "ClientError"]

DEFAULT_URL = "http://127.0.0.1:8000"


class AdminClient:
    def __init__(self, base_url: str = DEFAULT_URL, api_key: str | None = None, timeout_s: float = 600) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(base_url=base_url.rstrip("/"), headers=headers, timeout=timeout_s)

    def __enter__(self) -> AdminClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def health(self) -> dict[str, Any]:
        """`{"status": "ok", "version": ...}` from /healthz: the server is up, and which it is."""
        return self._call("GET", "/healthz")

    def models(self) -> list[dict[str, Any]]:
        return list(self._call("GET", "/v1/admin/models")["data"])

    def load(
        self, model: str, *, overrides: dict[str, Any] | None = None, replicas: int | None = None
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"overrides": overrides or {}}
        if replicas is not None:
            body["replicas"] = replicas
        return self._call("POST", f"/v1/admin/models/{model}/load", body)

    def unload(self, model: str, *, drain: bool = True) -> dict[str, Any]:
        return self._call("POST", f"/v1/admin/models/{model}/unload", {"drain": drain})

    def load_adapter(self, model: str, adapter: str) -> dict[str, Any]:
        """Load one of the model's declared LoRA adapters now; the model's admin status back."""
        return self._call("POST", f"/v1/admin/models/{model}/adapters/{adapter}/load")

    def unload_adapter(self, model: str, adapter: str) -> dict[str, Any]:
        """Unload an idle adapter (429 `overloaded` while a request uses it)."""
        return self._call("POST", f"/v1/admin/models/{model}/adapters/{adapter}/unload")

    def reload(self) -> dict[str, Any]:
        """Re-read the server's config and apply the difference: `added`, `removed`,
        `reloading` (at their next idle moment), `hot` (at once), `live`, `needs_restart`,
        `unchanged`. An invalid config is a `ClientError` (400 `invalid_config`): nothing changed."""
        return self._call("POST", "/v1/admin/reload")

    def memory(self) -> dict[str, Any]:
        return self._call("GET", "/v1/admin/memory")

    def gpu_memory(self) -> dict[str, Any]:
        """Each GPU (NVML), each model's GPU estimate and measured use per replica with its
        source and engine PIDs, and the GPU budget; `available: false` without a GPU."""
        return self._call("GET", "/v1/admin/gpu-memory")

    def usage(
        self, *, start_time: int | None = None, end_time: int | None = None, group_by: str = "key"
    ) -> dict[str, Any]:
        """Each key's usage, limits and what is left of them (`data`); with the server's
        `usage_store` on, `windowed` rows for the hours from `start_time` to `end_time`
        (unix seconds), per key or, with `group_by="model"`, per key and model."""
        params: dict[str, Any] = {"group_by": group_by}
        params.update({k: v for k, v in (("start_time", start_time), ("end_time", end_time)) if v is not None})
        return self._call("GET", "/v1/admin/usage", params=params)

    def _call(
        self, method: str, path: str, body: dict[str, Any] | None = None, params: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        try:
            response = self._http.request(method, path, json=body, params=params)
        except httpx.TransportError as exc:
            raise connection_failed(self._http.base_url, exc) from exc
        if response.status_code >= 400:
            raise error_from_response(response)
        result: dict[str, Any] = response.json()
        return result
