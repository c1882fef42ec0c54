"""The SDK's exceptions, and the one mapping from an HTTP answer to them.

A server's error is read from its envelope `{"error": {"message", "type", "param", "code"}}`
— modelpool's, OpenAI's, vLLM's, llama.cpp's — by `code` first (the most specific thing a
server says), then by HTTP status (an SSE error event has none: then by the envelope's
`type`). Bodies that are not an envelope (FastAPI's 422 `detail`, a proxy's HTML page)
still map by status, with the body text in the message, so callers catch the same class
whichever server answered. Nothing maps by matching message text.

    ClientError                       any SDK failure: .message .status_code .code .error_type .param
    ├── ConfigError                   models.yaml or a make_* call is wrong (nothing was sent)
    ├── ConnectionFailed              the server could not be reached (transport error)
    ├── ToolArgumentsError            a tool call's arguments are not the JSON object asked for (.arguments)
    ├── StructuredOutputError         the answer does not validate against response_format (.text)
    ├── ReadyTimeout (= NotReady)     wait_ready gave up: .last_status, .last_code
    ├── InvalidRequest (= BadRequest) 400, 422
    │   └── ContextLengthExceeded     400 context_length_exceeded
    ├── AuthenticationError           401
    ├── PermissionDenied              403
    │   └── RemoteNotAllowed          403 remote_not_allowed
    ├── NotFound                      404
    │   └── ModelNotFound             404 model_not_found
    ├── ModelNotLoaded                409 model_not_loaded (modelpool with autoload off)
    ├── RequestTooLarge               413
    ├── Overloaded                    429 (.retry_after_s)
    └── ServerError                   5xx not named below
        ├── UpstreamUnavailable       502 (the server's engine or upstream is unreachable)
        ├── ModelNotReady             503 model_not_ready (.retry_after_s): still loading, retry
        └── ModelLoadError            503 model_load_error / model_source_error: retrying will not help soon
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import httpx


class ClientError(Exception):
    """The server answered with an error, could not be reached, or the SDK was misconfigured."""

    def __init__(
        self,
        message: str,
        status_code: int | None = None,
        code: str | None = None,
        *,
        error_type: str | None = None,
        param: str | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status_code = status_code
        self.code = code
        self.error_type = error_type
        self.param = param
        self.retry_after_s = retry_after_s


class ConfigError(ClientError):
    """A models.yaml or make_* problem, found before anything was sent."""


class ConnectionFailed(ClientError):
    """The server could not be reached, or the connection broke mid-answer."""


class ToolArgumentsError(ClientError):
    """A tool call's `arguments` are not a JSON object (or do not fit the tool's model).

    The server answered fine; the model wrote arguments that cannot be used. `.arguments`
    keeps the text as the model wrote it, so an agent can show it back to the model."""

    def __init__(self, message: str, *, tool_name: str, arguments: str) -> None:
        super().__init__(message)
        self.tool_name = tool_name
        self.arguments = arguments


class StructuredOutputError(ClientError):
    """The answer to a `response_format=Model` request is not valid JSON for the model.

    `.text` is the model's whole answer (the message holds at most its first 2000
    characters), so a caller can log it, retry, or repair it."""

    def __init__(self, message: str, *, text: str) -> None:
        super().__init__(message)
        self.text = text


class ReadyTimeout(ClientError):
    """wait_ready ran out of time; the last answer seen is in the message and attributes."""

    def __init__(self, message: str, *, last_status: int | None, last_code: str | None) -> None:
        super().__init__(message, last_status, last_code)
        self.last_status = last_status
        self.last_code = last_code


NotReady = ReadyTimeout


class InvalidRequest(ClientError):
    """The request was wrong (400, or 422 from servers that validate with FastAPI's defaults)."""


BadRequest = InvalidRequest


class ContextLengthExceeded(InvalidRequest):
    """The prompt plus max_tokens does not fit the model's context window."""


class AuthenticationError(ClientError):
    """No API key, or a wrong one (401)."""


class PermissionDenied(ClientError):
    """The key is valid but lacks the scope for this call (403)."""


class RemoteNotAllowed(PermissionDenied):
    """modelpool refuses to send this request to a remote upstream without `allow_remote`."""


class NotFound(ClientError):
    """No such route or resource on this server (404)."""


class ModelNotFound(NotFound):
    """The server serves no model by this name or alias."""


class ModelNotLoaded(ClientError):
    """The model is not loaded and the server will not load it on demand (409)."""


class RequestTooLarge(ClientError):
    """The request body is over the server's limit (413)."""


class Overloaded(ClientError):
    """The model's queue is full (or a rate limit hit); `retry_after_s` says when to come back."""


class ServerError(ClientError):
    """The server failed (5xx) in a way no subclass names."""


class UpstreamUnavailable(ServerError):
    """The engine process or remote upstream behind the model could not be reached (502)."""


class ModelNotReady(ServerError):
    """The model is still loading: retrying shortly is the right move."""


class ModelLoadError(ServerError):
    """The model failed to load: retrying at once will not help (the server retries after a cooldown)."""


_BY_CODE: dict[str, type[ClientError]] = {
    "context_length_exceeded": ContextLengthExceeded,
    "remote_not_allowed": RemoteNotAllowed,
    "model_not_found": ModelNotFound,
    "model_not_loaded": ModelNotLoaded,
    "request_too_large": RequestTooLarge,
    "model_not_ready": ModelNotReady,
    "model_load_error": ModelLoadError,
    "model_source_error": ModelLoadError,
    "upstream_unavailable": UpstreamUnavailable,
}
_BY_STATUS: dict[int, type[ClientError]] = {
    400: InvalidRequest,
    401: AuthenticationError,
    403: PermissionDenied,
    404: NotFound,
    409: ModelNotLoaded,
    413: RequestTooLarge,
    422: InvalidRequest,
    429: Overloaded,
    502: UpstreamUnavailable,
}


_BY_TYPE: dict[str, type[ClientError]] = {
    "invalid_request_error": InvalidRequest,
    "authentication_error": AuthenticationError,
    "permission_error": PermissionDenied,
    "server_error": ServerError,
}


def error_class(status: int | None, code: str | None, error_type: str | None = None) -> type[ClientError]:
    """The most specific class: the code's, else the status's, else (an SSE error event has
    no status) the envelope type's."""
    if code in _BY_CODE:
        return _BY_CODE[code]
    if status in _BY_STATUS:
        return _BY_STATUS[status]
    if status is not None and status >= 500:
        return ServerError
    if status is None and error_type in _BY_TYPE:
        return _BY_TYPE[error_type]
    return ClientError


def error_from_payload(
    payload: Mapping[str, Any], status: int | None = None, retry_after_s: float | None = None
) -> ClientError:
    """An error from a parsed body that holds an `error` object (a response, or an SSE event)."""
    error = payload.get("error")
    if isinstance(error, str):  # some servers send {"error": "text"}
        error = {"message": error}
    if not isinstance(error, Mapping):
        error = {}
    message = str(error.get("message") or f"HTTP {status}: {json.dumps(dict(payload))[:500]}")
    raw_code = error.get("code")
    code = raw_code if isinstance(raw_code, str) else None  # llama.cpp's server puts the status here
    if status is None:
        status = _int_or_none(raw_code)
    error_type = _text_or_none(error.get("type"))
    cls = error_class(status, code, error_type)
    return cls(
        message,
        status,
        code,
        error_type=error_type,
        param=_text_or_none(error.get("param")),
        retry_after_s=retry_after_s,
    )


def error_from_response(response: httpx.Response) -> ClientError:
    """The typed error for a response with status ≥ 400 (its body must have been read)."""
    retry_after = _retry_after(response.headers)
    try:
        payload = response.json()
    except ValueError:
        payload = None
    if isinstance(payload, Mapping) and "error" in payload:
        return error_from_payload(payload, response.status_code, retry_after)
    text = response.text.strip()[:500] or response.reason_phrase
    cls = error_class(response.status_code, None)
    return cls(f"HTTP {response.status_code}: {text}", response.status_code, retry_after_s=retry_after)


def connection_failed(base_url: str | httpx.URL, exc: Exception) -> ConnectionFailed:
    return ConnectionFailed(f"cannot reach {base_url}: {str(exc) or type(exc).__name__}")


def _retry_after(headers: httpx.Headers) -> float | None:
    try:
        return float(headers["retry-after"])
    except (KeyError, ValueError):
        return None


def _text_or_none(value: object) -> str | None:
    return None if value is None else str(value)


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
