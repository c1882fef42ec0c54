"""Files and batches as the Files and Batches routes see them: the records, and the two
stores (Protocols: the runtime's SQLite-backed `FileStore` and `BatchRunner` are one each).

A file or batch belongs to the key that made it (`Owner`): another key is told what it
would be told for an id that never existed (404), so ids cannot be probed; the admin
scope sees every key's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Literal, Protocol

from modelpool.owner import Owner

BatchStatus = Literal[
    "validating", "failed", "in_progress", "finalizing", "completed", "expired", "cancelling", "cancelled"
]
TERMINAL: frozenset[str] = frozenset({"failed", "completed", "expired", "cancelled"})
"""States a batch never leaves."""
Order = Literal["asc", "desc"]


@dataclass(frozen=True)
class FileRecord:
    id: str
    owner: str
    filename: str
    purpose: str
    bytes: int
    created_at: int
    lines: int = 0
    """JSONL lines (an input file's requests; 0 for a file whose purpose is not `batch`)."""


@dataclass(frozen=True)
class LineError:
    """Why an input file cannot run (OpenAI's `errors.data[]` entry); `line` is 1-based."""

    code: str
    message: str
    line: int | None = None
    param: str | None = None


@dataclass
class RequestCounts:
    total: int = 0
    completed: int = 0
    failed: int = 0


@dataclass
class BatchRecord:
    id: str
    owner: str
    endpoint: str
    input_file_id: str
    completion_window: str
    created_at: int
    expires_at: int
    status: BatchStatus = "validating"
    metadata: dict[str, str] | None = None
    model: str | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    errors: list[LineError] = field(default_factory=list)
    counts: RequestCounts = field(default_factory=RequestCounts)
    times: dict[str, int] = field(default_factory=dict)
    """When each state was entered: `in_progress_at`, `finalizing_at`, `completed_at`, ..."""
    usage: dict[str, int] = field(default_factory=dict)
    """Tokens its requests used: `input_tokens`, `output_tokens`, `total_tokens`."""


@dataclass(frozen=True)
class Page:
    """One page of a listing, in the order asked for; `has_more` when the listing goes on."""

    data: list[Any]
    has_more: bool


class FileStorage(Protocol):
    async def add(self, owner: Owner, filename: str, purpose: str, source: IO[bytes]) -> FileRecord:
        """Store an upload read from `source` (off the event loop), checked line by line."""

    def get(self, file_id: str, caller: Owner) -> FileRecord:
        """The file, if `caller` may read it (else `ObjectNotFound`)."""

    def path(self, record: FileRecord) -> Path:
        """Where its bytes are."""

    def list(self, caller: Owner, purpose: str | None, limit: int, after: str | None, order: Order) -> Page:
        """The files `caller` may read, newest first with `desc`."""

    async def delete(self, file_id: str, caller: Owner) -> FileRecord:
        """Remove the file and its bytes."""


class BatchService(Protocol):
    async def create(
        self, owner: Owner, input_file_id: str, endpoint: str, metadata: dict[str, str] | None
    ) -> BatchRecord:
        """Validate the input file and start the batch in the background."""

    def get(self, batch_id: str, caller: Owner) -> BatchRecord:
        """The batch, if `caller` may read it (else `ObjectNotFound`)."""

    def list(self, caller: Owner, limit: int, after: str | None) -> Page:
        """The batches `caller` may read, newest first."""

    async def cancel(self, batch_id: str, caller: Owner) -> BatchRecord:
        """Stop the batch: no new request starts, the ones running stop now."""


@dataclass(frozen=True)
class LineAnswer:
    """What the endpoint answered one line of a batch: as a client would have got it."""

    status_code: int
    request_id: str
    body: Any
    """The response's JSON (an error envelope when `status_code` is not 2xx)."""
    retry_after_s: float | None = None
    """A 429's Retry-After: the line is tried again after it (a queue or budget full)."""
