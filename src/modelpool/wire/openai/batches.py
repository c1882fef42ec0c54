"""OpenAI's Files and Batches shapes: the create-batch body, the `file` and `batch`
objects, list pages, and each batch line's body checked by the schema of the route it is
for (the same pydantic model, so a line that would be a 400 there fails the batch here)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, StringConstraints, ValidationError

from modelpool.errors import InvalidRequest
from modelpool.pool_api.batches import BatchRecord, FileRecord, Page
from modelpool.wire.common import WireModel
from modelpool.wire.openai.chat import ChatCompletionBody
from modelpool.wire.openai.completions import CompletionBody
from modelpool.wire.openai.embeddings import EmbeddingsBody
from modelpool.wire.openai.errors import validation_message
from modelpool.wire.openai.responses import ResponsesBody

Endpoint = Literal["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses"]
LINE_SCHEMAS: dict[str, type[BaseModel]] = {
    "/v1/chat/completions": ChatCompletionBody,
    "/v1/completions": CompletionBody,
    "/v1/embeddings": EmbeddingsBody,
    "/v1/responses": ResponsesBody,
}
ObjectId = Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
"""A file or batch id as ours look (`file-…`, `batch_…`): anything else is no id of ours."""
MAX_PAGE = 10_000
MetadataKey = Annotated[str, StringConstraints(max_length=64)]
MetadataValue = Annotated[str, StringConstraints(max_length=512)]
_TIMED = ("in_progress", "finalizing", "completed", "failed", "expired", "cancelling", "cancelled")
"""The states whose time of entry a batch object reports as `<state>_at`."""


class CreateBatchBody(WireModel):
    input_file_id: ObjectId
    """An uploaded file of purpose `batch`: one request a line."""
    endpoint: Endpoint
    """Where every line goes; each line's `url` must be it."""
    completion_window: Literal["24h"]
    """The only window OpenAI offers: past it, what has not run is not run (`expired`)."""
    metadata: dict[MetadataKey, MetadataValue] | None = Field(default=None, max_length=16)
    """Up to 16 key-value pairs, kept with the batch."""


def check_line(endpoint: str, body: dict[str, Any]) -> str:
    """The model `body` names, if the route at `endpoint` would take it; else InvalidRequest."""
    try:
        parsed = LINE_SCHEMAS[endpoint].model_validate(body)
    except ValidationError as exc:
        message, param = validation_message(exc.errors())
        raise InvalidRequest(message, param=f"body.{param}" if param else "body") from None
    model = getattr(parsed, "model", None)
    return model if isinstance(model, str) else ""


def file_json(record: FileRecord) -> dict[str, Any]:
    return {"id": record.id, "object": "file", "bytes": record.bytes, "created_at": record.created_at,
            "filename": record.filename, "purpose": record.purpose, "status": "processed",
            "expires_at": None, "status_details": None}  # fmt: skip


def batch_json(record: BatchRecord) -> dict[str, Any]:
    times = {f"{state}_at": record.times.get(f"{state}_at") for state in _TIMED}
    errors = None
    if record.errors:
        listed = [{"code": e.code, "message": e.message, "line": e.line, "param": e.param} for e in record.errors]
        errors = {"object": "list", "data": listed}
    counts = record.counts
    return {
        "id": record.id, "object": "batch", "endpoint": record.endpoint, "model": record.model,
        "errors": errors, "input_file_id": record.input_file_id, "completion_window": record.completion_window,
        "status": record.status, "output_file_id": record.output_file_id, "error_file_id": record.error_file_id,
        "created_at": record.created_at, "expires_at": record.expires_at, **times,
        "request_counts": {"total": counts.total, "completed": counts.completed, "failed": counts.failed},
        "usage": _usage(record.usage) if record.usage else None, "metadata": record.metadata,
    }  # fmt: skip


def _usage(usage: dict[str, int]) -> dict[str, Any]:
    return {**usage, "input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}}


def page_json(page: Page, render: Any) -> dict[str, Any]:
    data = [render(item) for item in page.data]
    first, last = (data[0]["id"], data[-1]["id"]) if data else (None, None)
    return {"object": "list", "data": data, "first_id": first, "last_id": last, "has_more": page.has_more}
