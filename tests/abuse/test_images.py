"""Issue 27, item 2 (images): decoded media is bounded while decoding, not after. Every
image-capable backend has a default `max_images`; the server caps the images of a request
and their pixels together (from the headers, before any pixel is decoded); decodes share
one server-wide budget of threads; and when one image of a request fails, its siblings
are cancelled instead of running on.

Real images made by Pillow; fetches from a real HTTP server on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import base64
import io
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web
from PIL import Image

from modelpool.backends.llama_cpp.backend import LlamaCppBackend
from modelpool.backends.managed.llama_server import LlamaServerBackend
from modelpool.backends.managed.vllm_serve import VllmServeBackend
from modelpool.backends.remote.backend import OpenAIRemoteBackend
from modelpool.backends.transformers.backend import TransformersBackend
from modelpool.capabilities import Capabilities, Modality
from modelpool.errors import InvalidRequest, RequestTooLarge
from modelpool.inference import ChatMessage, ChatRequest, ImageInput, TextPart
from modelpool.media.images import ImagePolicy, decode
from modelpool.offload import IMAGE_DECODES
from modelpool.runtime.tasks import images as runtime_images
from modelpool.runtime.tasks.images import with_loaded_images
from tests.conftest import serving
from tests.polling import until
from tests.web_servers import web_server

VISION = Capabilities(tasks=frozenset(), modalities=frozenset({Modality.TEXT, Modality.IMAGE}))


def png(size: tuple[int, int] = (8, 6), color: str = "red") -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, color).save(buffer, format="PNG")
    return buffer.getvalue()


def data_uri(data: bytes) -> str:
    return f"data:image/png;base64,{base64.b64encode(data).decode()}"


def chat_with(urls: list[str]) -> ChatRequest:
    parts: list[TextPart | ImageInput] = [
        TextPart("what is this?"),
        *(ImageInput(url, f"messages[0].content[{i + 1}]") for i, url in enumerate(urls)),
    ]
    return ChatRequest((ChatMessage("user", "what is this?", parts=tuple(parts)),))


@pytest.mark.parametrize(
    ("backend", "options"),
    [
        (OpenAIRemoteBackend, {"base_url": "http://127.0.0.1:9/v1", "vision": True}),
        (LlamaServerBackend, {"mmproj": "/models/mmproj.gguf"}),
        (LlamaCppBackend, {"mmproj": "/models/mmproj.gguf"}),
        (TransformersBackend, {"vision": True}),
        (VllmServeBackend, {"limit_mm_per_prompt": {"image": 3}}),
    ],
    ids=["openai_remote", "llama_server", "llama_cpp", "transformers", "vllm"],
)
def test_every_image_capable_backend_has_a_default_max_images(backend: Any, options: dict[str, Any]) -> None:
    declared = backend.capabilities_for(backend.Options(**options))
    assert Modality.IMAGE in declared.modalities
    assert declared.max_images is not None and 1 <= declared.max_images <= 16


async def test_more_images_than_the_server_allows_are_refused_before_any_is_read() -> None:
    """The third image is past `server.max_images_per_request`; none is decoded (the first
    is not even base64, and that is not what the client hears)."""
    request = chat_with(["data:image/png;base64,@@@", data_uri(png()), data_uri(png())])
    with pytest.raises(InvalidRequest) as refused:
        await with_loaded_images(request, "eyes", VISION, ImagePolicy(max_images=2))
    assert refused.value.param == "messages[0].content[3]"
    assert "server.max_images_per_request" in refused.value.message


async def test_the_models_own_max_images_is_named_when_it_is_the_tighter() -> None:
    request = chat_with([data_uri(png())] * 3)
    model = Capabilities(tasks=frozenset(), modalities=VISION.modalities, max_images=1)
    with pytest.raises(InvalidRequest) as refused:
        await with_loaded_images(request, "eyes", model, ImagePolicy(max_images=8))
    assert refused.value.param == "messages[0].content[2]" and "reads at most 1 images" in refused.value.message


async def test_the_pixels_of_all_images_together_are_capped_from_their_headers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Three 100x100 images under a 25,000-pixel request cap: 413 naming the image that passes
    it, and not one pixel decoded (the decoder is never called)."""
    decoded: list[str] = []
    real = decode

    def noted(data: bytes, max_pixels: int, param: str) -> Any:
        decoded.append(param)
        return real(data, max_pixels, param)

    monkeypatch.setattr(runtime_images, "decode", noted)
    request = chat_with([data_uri(png((100, 100)))] * 3)
    with pytest.raises(RequestTooLarge) as refused:
        await with_loaded_images(request, "eyes", VISION, ImagePolicy(max_request_pixels=25_000))
    assert refused.value.param == "messages[0].content[3]"
    assert "server.max_request_image_pixels" in refused.value.message and decoded == []
    loaded = await with_loaded_images(chat_with([data_uri(png((100, 100)))] * 2), "eyes", VISION,
                                      ImagePolicy(max_request_pixels=25_000))  # fmt: skip
    assert [image.image.size for image in loaded.messages[0].images] == [(100, 100), (100, 100)]


@dataclass
class GatedDecodes:
    """Stands in for the decoder: counts the decodes running at once and holds each at a
    gate until the test opens it, then decodes for real."""

    real: Any
    gate: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    active: int = 0
    peak: int = 0
    done: int = 0

    def __call__(self, data: bytes, max_pixels: int, param: str) -> Any:
        with self.lock:
            self.active += 1
            self.peak = max(self.peak, self.active)
        try:
            assert self.gate.wait(timeout=30), "the test never opened the gate"
            return self.real(data, max_pixels, param)
        finally:
            with self.lock:
                self.active -= 1
                self.done += 1


async def test_decodes_share_one_budget_for_the_whole_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """Six requests of one image each, at once: two decode, four wait their turn in the
    server-wide queue; all six finish when let through."""
    gated = GatedDecodes(decode)
    monkeypatch.setattr(runtime_images, "decode", gated)
    requests = [chat_with([data_uri(png(color=color))]) for color in ("red", "green", "blue", "white", "black", "gray")]
    tasks = [asyncio.create_task(with_loaded_images(r, "eyes", VISION, ImagePolicy())) for r in requests]
    try:
        await until(lambda: gated.active == IMAGE_DECODES.workers and IMAGE_DECODES.waiting == 4,
                    "two decodes running and four queued")  # fmt: skip
        assert gated.peak == IMAGE_DECODES.workers
    finally:
        gated.gate.set()
    loaded = await asyncio.gather(*tasks)
    assert gated.done == 6 and gated.peak == IMAGE_DECODES.workers
    assert all(request.messages[0].images[0].image is not None for request in loaded)


@dataclass
class SlowImageServer:
    """A real HTTP server: `/slow` streams an image a few bytes at a time until its client
    goes away (noted in `client_left`); `/missing` answers 404 once `/slow` is streaming."""

    streaming: asyncio.Event = field(default_factory=asyncio.Event)
    client_left: asyncio.Event = field(default_factory=asyncio.Event)

    async def slow(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "image/png", "Content-Length": "100000"})
        await response.prepare(request)
        self.streaming.set()
        try:
            for _ in range(2000):  # 100 s at most: far past any bound below
                await response.write(b"\0" * 50)
                await asyncio.sleep(0.05)
        except (ConnectionResetError, asyncio.CancelledError):
            self.client_left.set()
            raise
        return response

    async def missing(self, request: web.Request) -> web.Response:
        await self.streaming.wait()
        return web.Response(status=404)


@pytest.fixture
async def slow_server() -> AsyncIterator[tuple[SlowImageServer, str]]:
    server = SlowImageServer()
    app = web.Application(handler_args={"handler_cancellation": True})
    app.router.add_get("/slow", server.slow)
    app.router.add_get("/missing", server.missing)
    async with web_server(app) as port:
        yield server, f"http://127.0.0.1:{port}"


async def test_a_failing_image_cancels_its_siblings(slow_server: tuple[SlowImageServer, str]) -> None:
    """One image of a request fails while another is still being fetched: the request fails
    at once and the other fetch is cut (its server sees the client leave), rather than
    running on to its deadline."""
    server, url = slow_server
    policy = ImagePolicy(allow_remote=True, allowed_hosts=frozenset({"127.0.0.1"}), fetch_timeout_s=60)
    request = chat_with([f"{url}/slow", f"{url}/missing"])
    with pytest.raises(InvalidRequest) as refused:
        await asyncio.wait_for(with_loaded_images(request, "eyes", VISION, policy), 10)
    assert refused.value.param == "messages[0].content[2]" and "HTTP 404" in refused.value.message
    await until(server.client_left.is_set, "the sibling fetch to be cut", timeout_s=5)


async def test_the_caps_reach_clients_as_error_envelopes() -> None:
    """Through the API, to a remote vision model (never reached: images are checked before
    the request waits for its model): too many images is a 400, too many pixels a 413."""
    remote = {"backend": "openai_remote", "allow_remote": True, "preload": False,
              "options": {"base_url": "http://127.0.0.1:9/v1", "vision": True}}  # fmt: skip
    server = {"max_images_per_request": 2, "max_request_image_pixels": 15_000}
    cli: dict[str, object] = {"starter_models": False, "models": {"eyes": remote}, "server": server}

    def body(*images: bytes) -> dict[str, Any]:
        parts = [{"type": "image_url", "image_url": {"url": data_uri(image)}} for image in images]
        return {"model": "eyes", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, *parts]}]}

    async with serving(cli) as (_, client):
        many = await client.post("/v1/chat/completions", json=body(png(), png(), png()))
        big = await client.post("/v1/chat/completions", json=body(png((100, 100)), png((100, 100))))
        listed = {m["id"]: m for m in (await client.get("/v1/models")).json()["data"]}
    assert many.status_code == 400 and many.json()["error"]["param"] == "messages[0].content[3]", many.text
    assert "server.max_images_per_request" in many.json()["error"]["message"]
    assert big.status_code == 413 and big.json()["error"]["code"] == "request_too_large", big.text
    assert big.json()["error"]["param"] == "messages[0].content[2]"
    assert listed["eyes"]["capabilities"]["max_images"] == 8  # the remote backend's default
