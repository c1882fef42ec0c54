"""When an engine step fails: what the client of each failed sequence is told (a generic
message naming its request id) and what the log keeps (the detail, with that request id).

The engines that batch sequences (llama.cpp, transformers, CTranslate2) fail only the
sequence that caused an error where that can be told (a bad token id, one row's
sampling or logprobs), and every sequence of the step only when it cannot (the forward
pass itself failed)."""

from __future__ import annotations

import logging

from modelpool.errors import GenerationFailed

log = logging.getLogger("modelpool.backends")


def sequence_failed(request_id: str, error: BaseException, *, what: str = "a sequence's step") -> GenerationFailed:
    """Log `error` (with its traceback) for `request_id`; the error its client gets instead."""
    log.error("%s failed: %r", what, error, exc_info=error, extra={"request_id": request_id})
    return generation_failed(request_id)


def generation_failed(request_id: str) -> GenerationFailed:
    """What a client is told of an engine failure: no detail, the request id to report."""
    return GenerationFailed(f"generation failed (request id {request_id}); the server's log has the details")
