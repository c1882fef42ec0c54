"""Logging: readable text by default, one JSON object a line with `--log-format json`.

Every record carries the id of the request it was logged under (a context variable set
by the API middleware), so a request's lines can be found by its X-Request-ID.
"""

from __future__ import annotations

import json
import logging
import sys
from contextvars import ContextVar
from datetime import datetime, timezone

from modelpool.config.schema import LogFormat

current_request_id: ContextVar[str] = ContextVar("current_request_id", default="-")

# Attributes every LogRecord has; anything else was passed with `extra=` and is ours to show.
_STANDARD_ATTRS = set(vars(logging.LogRecord("", 0, "", 0, "", None, None)))
_STANDARD_ATTRS |= {"message", "asctime", "request_id", "color_message"}


class _RequestIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            record.request_id = current_request_id.get()
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": datetime.fromtimestamp(record.created, tz=timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": getattr(record, "request_id", "-"),
        }
        entry.update({k: v for k, v in vars(record).items() if k not in _STANDARD_ATTRS})
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s [%(request_id)s] %(message)s%(fields)s")

    def format(self, record: logging.LogRecord) -> str:
        extras = {k: v for k, v in vars(record).items() if k not in _STANDARD_ATTRS and k != "fields"}
        record.fields = "".join(f" {k}={v}" for k, v in extras.items()) if record.name != "modelpool.access" else ""
        return super().format(record)


def configure_logging(log_format: LogFormat, level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format is LogFormat.JSON else TextFormatter())
    handler.addFilter(_RequestIdFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("uvicorn.access", "httpx", "httpcore", "sentence_transformers", "huggingface_hub"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
