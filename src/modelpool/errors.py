"""Every error modelpool raises on purpose, and how a client sees it.

Each class carries the HTTP ``status_code`` and the OpenAI envelope ``type`` and ``code``;
``api.errors`` renders any of them as ``{"error": {"message", "type", "param", "code"}}``.
Nothing maps errors by matching message text.

    ModelpoolError                      500  server_error / internal_error
    ├── ConfigError                     500  server_error / config_error   (raised at start)
    ├── InvalidRequest                  400  invalid_request_error / invalid_value (param named)
    │   ├── ContextLengthExceeded       400  invalid_request_error / context_length_exceeded
    │   ├── UnsupportedTask             400  invalid_request_error / unsupported_task
    │   ├── AdapterNotFound             400  invalid_request_error / adapter_not_found (LoRA)
    │   ├── CommitEmpty                 400  invalid_request_error / input_audio_buffer_commit_empty (live audio)
    │   └── InvalidConfig               400  invalid_request_error / invalid_config (a reload's re-read config)
    ├── AuthenticationFailed            401  authentication_error / invalid_api_key
    ├── PermissionDenied                403  permission_error / insufficient_scope
    │   ├── RemoteNotAllowed            403  permission_error / remote_not_allowed
    │   └── OriginNotAllowed            403  permission_error / origin_not_allowed (a foreign web page)
    ├── ModelNotFound                   404  invalid_request_error / model_not_found
    ├── ResponseNotFound                404  invalid_request_error / previous_response_not_found (or another key's)
    ├── ObjectNotFound                  404  invalid_request_error / not_found (a file or batch, or another key's)
    ├── ModelNotLoaded                  409  invalid_request_error / model_not_loaded  (autoload off)
    ├── ReloadUnavailable               409  invalid_request_error / reload_unavailable (no config to re-read)
    ├── HostNotAllowed                  421  invalid_request_error / host_not_allowed (DNS rebinding)
    ├── RequestTimeout                  408  invalid_request_error / request_timeout (a body that stopped coming)
    ├── RequestTooLarge                 413  invalid_request_error / request_too_large
    │   └── StoreFull                   413  invalid_request_error / store_full (a transcript store bound)
    │   └── AudioTooLong                413  invalid_request_error / request_too_large (server.max_audio_seconds)
    ├── Overloaded                      429  overloaded / overloaded       (Retry-After)
    ├── RateLimited                     429  requests or tokens / rate_limit_exceeded (Retry-After)
    ├── ClientDisconnected              499  invalid_request_error / client_closed_request (never seen: logs only)
    ├── ModelNotReady                   503  server_error / model_not_ready   (Retry-After)
    ├── ModelLoadFailed                 503  server_error / model_load_error  (Retry-After: the cooldown)
    │   └── ModelSourceError            503  server_error / model_source_error
    ├── BatchApiUnavailable             503  server_error / batch_api_unavailable (another server holds batch_api.dir)
    ├── InsufficientCapacity            503  server_error / insufficient_capacity
    ├── ModelUnloaded                   503  server_error / model_unloaded (a forced unload cut the request)
    ├── ShuttingDown                    503  server_error / shutting_down
    ├── GenerationFailed                500  server_error / generation_failed
    ├── ExtraNotInstalled               501  server_error / extra_not_installed (names the pip extra)
    ├── UpstreamUnavailable             502  server_error / upstream_unavailable (engine process or remote unreachable)
    │   └── ReplicaUnavailable          502  server_error / replica_unavailable (Ray: the replica's node died)
    └── UpstreamError                   4xx/502  the upstream's own type and code (its 4xx pass through; 5xx → 502)
"""

from __future__ import annotations

import math

from modelpool.inference import RequestUsage


class ModelpoolError(Exception):
    status_code: int = 500
    type: str = "server_error"
    code: str = "internal_error"
    usage: RequestUsage | None = None
    """What a failed pool request used before it failed (set by the pool, which returns usage
    with its results: on a failure, with the error), for the caller to charge."""

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param

    @property
    def headers(self) -> dict[str, str]:
        """Extra response headers (Retry-After, ...). Empty unless a subclass needs them."""
        return {}

    def __reduce__(self) -> tuple[object, ...]:
        # Exceptions pickle as `cls(*args)`, which breaks every subclass whose constructor
        # takes other arguments (ModelNotFound(model_id, known), RateLimited(..., limit=...)):
        # rebuild from the state instead, so an error crosses a process boundary intact.
        return (_restore, (type(self), self.args, self.__dict__))


def _restore(cls: type[ModelpoolError], args: tuple[object, ...], state: dict[str, object]) -> ModelpoolError:
    error = cls.__new__(cls, *args)
    error.__dict__.update(state)
    return error


class ConfigError(ModelpoolError):
    code = "config_error"


class InvalidRequest(ModelpoolError):
    status_code = 400
    type = "invalid_request_error"
    code = "invalid_value"


class ContextLengthExceeded(InvalidRequest):
    code = "context_length_exceeded"


class UnsupportedTask(InvalidRequest):
    code = "unsupported_task"


class AdapterNotFound(InvalidRequest):
    """A request names a LoRA adapter its model does not have."""

    code = "adapter_not_found"


class CommitEmpty(InvalidRequest):
    """A live session's `input_audio_buffer.commit` with no utterance to commit (OpenAI's code)."""

    code = "input_audio_buffer_commit_empty"


class ModalityUnsupported(InvalidRequest):
    """An input the model cannot read (an image to a text-only model)."""

    code = "modality_unsupported"


class AuthenticationFailed(ModelpoolError):
    status_code = 401
    type = "authentication_error"
    code = "invalid_api_key"


class PermissionDenied(ModelpoolError):
    status_code = 403
    type = "permission_error"
    code = "insufficient_scope"


class RemoteNotAllowed(PermissionDenied):
    code = "remote_not_allowed"


class OriginNotAllowed(PermissionDenied):
    """A state-changing request from a web page of an origin the server does not serve."""

    code = "origin_not_allowed"


class ModelNotFound(ModelpoolError):
    status_code = 404
    type = "invalid_request_error"
    code = "model_not_found"

    def __init__(self, model_id: str, known: list[str] | None) -> None:
        """`known`: the ids to list as a hint; None lists none (a caller without a key)."""
        hint = "" if known is None else f" Known models: {', '.join(sorted(known)) or 'none are configured'}."
        super().__init__(f"The model '{model_id}' does not exist.{hint}", param="model")
        self.model_id = model_id


class ResponseNotFound(ModelpoolError):
    """`previous_response_id` names no response this key may read: one never stored, one
    dropped, or another key's (the same answer for all, so ids cannot be probed)."""

    status_code = 404
    type = "invalid_request_error"
    code = "previous_response_not_found"


class ObjectNotFound(ModelpoolError):
    """A file or batch id this key may not read: one never made, one deleted, or another
    key's (the same answer for all, so ids cannot be probed)."""

    status_code = 404
    type = "invalid_request_error"
    code = "not_found"


class InvalidConfig(InvalidRequest):
    """A config reload found the re-read config invalid: nothing changed."""

    code = "invalid_config"


class ReloadUnavailable(ModelpoolError):
    """This server has no config sources to re-read (a library app, Ray mode)."""

    status_code = 409
    type = "invalid_request_error"
    code = "reload_unavailable"


class ModelNotLoaded(ModelpoolError):
    status_code = 409
    type = "invalid_request_error"
    code = "model_not_loaded"


class HostNotAllowed(ModelpoolError):
    """A `Host` header naming no name this server answers to: a web page whose DNS name
    was rebound to this machine, or a client that needs `server.allowed_hosts`."""

    status_code = 421
    type = "invalid_request_error"
    code = "host_not_allowed"


class RequestTimeout(ModelpoolError):
    """The client stopped sending a request body it had begun (`server.body_timeout_s`)."""

    status_code = 408
    type = "invalid_request_error"
    code = "request_timeout"


class RequestTooLarge(ModelpoolError):
    status_code = 413
    type = "invalid_request_error"
    code = "request_too_large"


class StoreFull(RequestTooLarge):
    """A bound of a store modelpool keeps (transcript sources, entries, bytes) would be passed."""

    code = "store_full"


class AudioTooLong(RequestTooLarge):
    """Audio that decodes to more than `server.max_audio_seconds`: an upload, or what a live
    session has sent in all (that session is then closed)."""


class _RetryLater(ModelpoolError):
    """An error that tells the client when to come back."""

    def __init__(self, message: str, *, retry_after_s: float = 5, param: str | None = None) -> None:
        super().__init__(message, param=param)
        self.retry_after_s = max(1, round(retry_after_s))

    @property
    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after_s)}


class Overloaded(_RetryLater):
    status_code = 429
    type = "overloaded"
    code = "overloaded"


class RateLimited(_RetryLater):
    """An API key (or, with no keys, a client address) over its requests or tokens per
    minute. `type` names the limit (`requests` or `tokens`), as OpenAI's errors do."""

    status_code = 429
    code = "rate_limit_exceeded"

    def __init__(self, message: str, *, limit: str, retry_after_s: float) -> None:
        wait_ms = max(1, math.ceil(round(retry_after_s * 1000, 6)))  # float noise is not a ms more
        super().__init__(message, retry_after_s=math.ceil(wait_ms / 1000))  # rounded up: never early
        self.type = limit
        self.retry_after_ms = wait_ms

    @property
    def headers(self) -> dict[str, str]:
        # retry-after-ms: the exact wait, which the official SDKs prefer to Retry-After.
        return {**super().headers, "retry-after-ms": str(self.retry_after_ms)}


class ClientDisconnected(ModelpoolError):
    status_code = 499  # nginx's code for it: the response has nobody to go to
    type = "invalid_request_error"
    code = "client_closed_request"


class ModelNotReady(_RetryLater):
    status_code = 503
    code = "model_not_ready"

    def __init__(self, message: str, *, retry_after_s: float = 5) -> None:
        super().__init__(message, retry_after_s=retry_after_s, param="model")


class LoadAbandoned(ModelNotReady):
    """A load started by requests that all left before room was made for it: it stops
    rather than evict other models for nobody (the next request starts it again)."""


class ModelLoadFailed(_RetryLater):
    status_code = 503
    code = "model_load_error"


class BatchApiUnavailable(ModelpoolError):
    """The Batch and Files APIs are off on this server (another server holds their directory)."""

    status_code = 503
    code = "batch_api_unavailable"


class InsufficientCapacity(ModelpoolError):
    status_code = 503
    code = "insufficient_capacity"


class ModelUnloaded(ModelpoolError):
    status_code = 503
    code = "model_unloaded"


class ModelSourceError(ModelLoadFailed):
    code = "model_source_error"


class ShuttingDown(ModelpoolError):
    status_code = 503
    code = "shutting_down"


class StoreUnavailable(ModelpoolError):
    """A store modelpool keeps on disk (transcripts) cannot be written: a full disk, a
    read-only directory. Logged with the path; the client gets the reason only."""

    status_code = 503
    code = "store_unavailable"


class GenerationFailed(ModelpoolError):
    code = "generation_failed"


class ExtraNotInstalled(ModelpoolError):
    """A feature whose optional dependencies (a pip extra of modelpool) are not installed:
    501, as the server does not implement it as installed; the message says what to install."""

    status_code = 501
    code = "extra_not_installed"

    def __init__(self, feature: str, extra: str) -> None:
        super().__init__(f"{feature} needs modelpool's [{extra}] extra, which is not installed: "
                         f"pip install 'modelpool[{extra}]'")  # fmt: skip
        self.extra = extra


class UpstreamUnavailable(ModelpoolError):
    """The engine process or remote server could not be reached, or went away mid-request."""

    status_code = 502
    code = "upstream_unavailable"


class ReplicaUnavailable(UpstreamUnavailable):
    """Ray mode: the replica serving the request went away (its node or process died)."""

    code = "replica_unavailable"


class UpstreamError(ModelpoolError):
    """An error answered by an upstream server. Its 4xx statuses reach the client as they
    are (the request was at fault); anything else becomes 502."""

    def __init__(self, status: int, message: str, *, error_type: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.upstream_status = status
        self.status_code = status if 400 <= status < 500 else 502
        self.type = error_type or ("invalid_request_error" if self.status_code < 500 else "server_error")
        self.code = code or "upstream_error"


def carry_usage(error: BaseException, usage: RequestUsage) -> None:
    """Send what a request used before it stopped back with what stopped it, for its caller
    to charge: a `ModelpoolError` in its field; a cancellation (the caller left) the same way,
    since a caller who hangs up on a long whole request must not make its work free. asyncio
    re-raises the cancelled task's own `CancelledError` to whoever awaits the task."""
    vars(error)["usage"] = usage


def usage_carried(error: BaseException) -> RequestUsage | None:
    """What `carry_usage` put on `error` (None: nothing was counted)."""
    carried = error.usage if isinstance(error, ModelpoolError) else vars(error).get("usage")
    return carried if isinstance(carried, RequestUsage) else None
