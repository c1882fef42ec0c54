"""One request's timing and outcome, as `--json` writes it."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RequestRecord:
    """Times are seconds: `started_s` from the start of its level, the others from the
    request's own start. `error` is a kind (`http_401`, `timeout`, `connect`, `closed`,
    `non_json`, `incomplete`), `None` for a success."""

    index: int
    concurrency: int
    started_s: float = 0.0
    latency_s: float = 0.0
    ttft_s: float | None = None  # first content token (or first audio byte, for speech)
    output_tokens: int = 0
    prompt_tokens: int | None = None
    tokens_from_usage: bool = False  # else the content chunks were counted
    output_bytes: int = 0  # speech: the audio's size
    chunk_gaps_s: list[float] = field(default_factory=list)  # between content chunks
    status: int | None = None
    resent: int = 0  # sent again on a fresh connection: a kept-alive one was closed under it
    error: str | None = None
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.error is None

    def fail(self, kind: str, detail: str) -> RequestRecord:
        self.error, self.detail = kind, detail[:300]
        return self
