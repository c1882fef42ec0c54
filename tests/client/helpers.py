"""Small test utilities of the SDK tests: vector similarity, word lists, a real PNG, and a
scripted OpenAI-shaped server for wire tests."""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
import struct
import threading
import zlib
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def words(text: str) -> list[str]:
    return re.findall(r"[a-z']+", text.lower())


def tiny_png() -> bytes:
    """A real 1×1 PNG, made here (no image files in the repository)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\x00\xff\x00\x00")) + \
        chunk(b"IEND", b"")  # fmt: skip


class ScriptedServer:
    """A real OpenAI-shaped HTTP server on 127.0.0.1 (port 0: the OS picks a free one), in
    its own thread so that blocking sync clients can call it too. It records every request
    body and answers with the replies queued, in order; with none left it answers 500.
    With `required_key` it stands in for a hosted API: a request without that bearer key is
    answered 401 in OpenAI's envelope (and recorded). GETs (health probes) are recorded and
    answered 404, as a hosted API without /health does."""

    def __init__(self, required_key: str | None = None) -> None:
        self.requests: list[tuple[str, dict[str, Any]]] = []
        """(path, JSON body) of every request, in order."""
        self.authorizations: list[str | None] = []
        """The Authorization header of every POST, in order."""
        self.gets: list[str] = []
        self.required_key = required_key
        self._replies: deque[tuple[str, bytes]] = deque()
        self._http = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._http.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._http.server_address[1]}"
        # A short poll: shutdown() waits for the serving loop's next look (0.5 s by default).
        serve = {"poll_interval": 0.01}
        self._thread = threading.Thread(target=self._http.serve_forever, kwargs=serve, name="scripted", daemon=True)

    @property
    def bodies(self) -> list[dict[str, Any]]:
        return [body for _, body in self.requests]

    def answer_json(self, payload: Mapping[str, Any]) -> None:
        self._replies.append(("application/json", json.dumps(payload).encode()))

    def answer_sse(self, events: Sequence[Mapping[str, Any]]) -> None:
        """A server-sent event stream of these JSON events, then `[DONE]`."""
        text = "".join(f"data: {json.dumps(event)}\n\n" for event in events) + "data: [DONE]\n\n"
        self._replies.append(("text/event-stream", text.encode()))

    def __enter__(self) -> ScriptedServer:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._http.shutdown()
        self._http.server_close()
        self._thread.join(timeout=5)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server.gets.append(self.path)
                self._reply(404, "application/json", b'{"detail": "Not Found"}')

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                server.requests.append((self.path, json.loads(body)))
                authorization = self.headers.get("Authorization")
                server.authorizations.append(authorization)
                if server.required_key is not None and authorization != f"Bearer {server.required_key}":
                    error = {"error": {"message": "invalid key", "type": "invalid_request_error", "code": None}}
                    self._reply(401, "application/json", json.dumps(error).encode())
                elif server._replies:
                    self._reply(200, *server._replies.popleft())
                else:
                    error = {"error": {"message": "no reply scripted", "type": "server_error", "code": None}}
                    self._reply(500, "application/json", json.dumps(error).encode())

            def _reply(self, status: int, content_type: str, data: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: object) -> None:
                """Quiet: the tests assert on what was asked instead."""

        return Handler


def solid_png(color: str, size: tuple[int, int] = (64, 64)) -> bytes:
    """A one-colour PNG, drawn with Pillow."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", size, color).save(buffer, format="PNG")
    return buffer.getvalue()


@contextlib.contextmanager
def serving_file(data: bytes, content_type: str = "image/png") -> Iterator[str]:
    """A real HTTP server on 127.0.0.1 that answers every GET with `data`; yields its URL."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/picture.png"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
