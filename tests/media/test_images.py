"""Images from content parts: data URIs, guarded remote fetches (against a real HTTP server
on 127.0.0.1), allowed local directories, and every refusal as a 400/413 naming the part."""

from __future__ import annotations

import asyncio
import base64
import io
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import cast

import pytest
from aiohttp import web
from PIL import Image

from modelpool.errors import InvalidRequest, RequestTooLarge
from modelpool.media.images import ImagePolicy, is_public, load_image
from tests.web_servers import web_server

PART = "messages[0].content[1]"


def image_bytes(fmt: str = "PNG", size: tuple[int, int] = (8, 6), color: str = "red") -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, color).save(buffer, format=fmt)
    return buffer.getvalue()


def pixel(image: Image.Image) -> tuple[int, ...]:
    """The top-left pixel (Pillow types getpixel for every mode; these images are RGB)."""
    return cast(tuple[int, ...], image.getpixel((0, 0)))


def data_uri(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


async def test_a_data_uri_decodes_to_rgb_with_its_type() -> None:
    loaded = await load_image(data_uri(image_bytes("JPEG"), "image/jpeg"), ImagePolicy(), PART)
    assert loaded.image.mode == "RGB" and loaded.image.size == (8, 6) and loaded.mime == "image/jpeg"
    assert loaded.data_uri().startswith("data:image/jpeg;base64,")


async def test_a_gif_gives_its_first_frame() -> None:
    frames = [Image.new("RGB", (4, 4), color) for color in ("blue", "green")]
    buffer = io.BytesIO()
    frames[0].save(buffer, format="GIF", save_all=True, append_images=frames[1:])
    loaded = await load_image(data_uri(buffer.getvalue(), "image/gif"), ImagePolicy(), PART)
    assert loaded.mime == "image/gif" and pixel(loaded.image)[2] > 200  # blue, the first frame


@pytest.mark.parametrize(
    ("url", "policy", "error", "words"),
    [
        ("data:image/png," + "x" * 8, ImagePolicy(), InvalidRequest, "base64"),
        ("data:image/png;base64,@@@", ImagePolicy(), InvalidRequest, "not valid base64"),
        (data_uri(b"not an image"), ImagePolicy(), InvalidRequest, "cannot be decoded"),
        (data_uri(image_bytes("BMP")), ImagePolicy(), InvalidRequest, "BMP is not supported"),
        (data_uri(image_bytes(size=(100, 100))), ImagePolicy(max_pixels=5000), RequestTooLarge, "100x100"),
        (data_uri(image_bytes(size=(64, 64))), ImagePolicy(max_bytes=32), RequestTooLarge, "max_image_bytes"),
        ("http://example.com/cat.png", ImagePolicy(), InvalidRequest, "allow_remote_images"),
        ("ftp://example.com/cat.png", ImagePolicy(), InvalidRequest, "data:, http(s): or file:"),
        ("file:///etc/passwd", ImagePolicy(), InvalidRequest, "allowed_local_media_dirs"),
    ],
)
async def test_bad_images_are_refused_naming_the_part(
    url: str, policy: ImagePolicy, error: type[Exception], words: str
) -> None:
    with pytest.raises(error) as raised:
        await load_image(url, policy, PART)
    assert raised.value.param == PART and words in raised.value.message  # type: ignore[attr-defined]


def test_public_addresses() -> None:
    for address in ["127.0.0.1", "10.1.2.3", "192.168.0.1", "172.16.0.1", "169.254.169.254", "::1", "fd00::1",
                    "0.0.0.0", "::ffff:127.0.0.1", "224.0.0.1", "100.64.0.1"]:  # fmt: skip
        assert not is_public(address), address
    for address in ["93.184.216.34", "8.8.8.8", "2606:4700:4700::1111"]:
        assert is_public(address), address


@pytest.fixture
async def media_server() -> AsyncIterator[str]:
    """A real HTTP server on 127.0.0.1: an image, a redirect to the metadata address, a
    redirect to itself, a slow answer and an oversized one."""

    async def picture(_: web.Request) -> web.Response:
        return web.Response(body=image_bytes(color="green"), content_type="image/png")

    async def to_metadata(_: web.Request) -> web.Response:
        raise web.HTTPFound("http://169.254.169.254/latest/meta-data/")

    async def to_picture(_: web.Request) -> web.Response:
        raise web.HTTPFound("/cat.png")

    async def slow(_: web.Request) -> web.Response:
        await asyncio.sleep(2)
        return web.Response(body=b"")

    async def huge(_: web.Request) -> web.Response:
        return web.Response(body=b"\0" * 300_000, content_type="image/png")

    app = web.Application()
    app.router.add_get("/cat.png", picture)
    app.router.add_get("/metadata", to_metadata)
    app.router.add_get("/again", to_picture)
    app.router.add_get("/slow", slow)
    app.router.add_get("/huge", huge)
    async with web_server(app) as port:
        yield f"127.0.0.1:{port}"


async def test_a_server_on_loopback_is_refused_by_address_and_by_name(media_server: str) -> None:
    policy = ImagePolicy(allow_remote=True)
    port = media_server.split(":")[1]
    for url in [f"http://{media_server}/cat.png", f"http://localhost:{port}/cat.png"]:
        with pytest.raises(InvalidRequest) as raised:
            await load_image(url, policy, PART)
        assert "refused" in raised.value.message and "not a public address" in raised.value.message
        assert raised.value.param == PART


async def test_an_allowed_host_is_served_and_its_redirects_are_checked_again(media_server: str) -> None:
    policy = ImagePolicy(allow_remote=True, allowed_hosts=frozenset({"127.0.0.1"}), fetch_timeout_s=1,
                         max_bytes=100_000)  # fmt: skip
    served = await load_image(f"http://{media_server}/cat.png", policy, PART)
    assert served.mime == "image/png" and pixel(served.image)[1] > 100  # green
    again = await load_image(f"http://{media_server}/again", policy, PART)
    assert again.data == served.data
    with pytest.raises(InvalidRequest, match=re.escape("169.254.169.254 is not a public address")):
        await load_image(f"http://{media_server}/metadata", policy, PART)
    with pytest.raises(InvalidRequest, match="longer than 1 s"):
        await load_image(f"http://{media_server}/slow", policy, PART)
    with pytest.raises(RequestTooLarge):
        await load_image(f"http://{media_server}/huge", policy, PART)


async def test_local_files_only_under_allowed_directories(tmp_path: Path) -> None:
    allowed, elsewhere = tmp_path / "media", tmp_path / "private"
    allowed.mkdir()
    elsewhere.mkdir()
    (allowed / "cat.png").write_bytes(image_bytes())
    (elsewhere / "secret.png").write_bytes(image_bytes())
    (allowed / "link.png").symlink_to(elsewhere / "secret.png")
    policy = ImagePolicy(local_dirs=(allowed,))
    assert (await load_image(f"file://{allowed}/cat.png", policy, PART)).image.size == (8, 6)
    for url in [f"file://{elsewhere}/secret.png", f"file://{allowed}/link.png", f"file://{allowed}/../private/secret.png"]:
        with pytest.raises(InvalidRequest, match="allowed_local_media_dirs"):
            await load_image(url, policy, PART)
    with pytest.raises(InvalidRequest, match="cannot be read"):
        await load_image(f"file://{allowed}/missing.png", policy, PART)


@pytest.mark.parametrize(
    "host",
    ["１２７.０.０.１", "①②⑦.0.0.1", "127。0。0。1", "１６９.２５４.１６９.２５４", "[::1]", "[::ffff:127.0.0.1]",
     "[::127.0.0.1]", "2130706433", "0", "127.1"],
)  # fmt: skip
async def test_addresses_in_any_spelling_are_refused_before_connecting(host: str) -> None:
    """Hosts that yarl normalises to a loopback or metadata address (Unicode digits and dots),
    or that aiohttp would connect to without resolving: refused, never fetched."""
    with pytest.raises(InvalidRequest) as raised:
        await load_image(f"http://{host}:9/cat.png", ImagePolicy(allow_remote=True, fetch_timeout_s=2), PART)
    assert raised.value.param == PART
    assert "not a public address" in raised.value.message or "malformed" in raised.value.message


@pytest.mark.parametrize("url", ["http://[::1/cat.png", "https://[x]/a", "file:///tmp/%00x.png"])
async def test_malformed_urls_are_a_400(url: str) -> None:
    with pytest.raises(InvalidRequest) as raised:
        await load_image(url, ImagePolicy(allow_remote=True, local_dirs=(Path("/tmp"),)), PART)
    assert raised.value.param == PART


async def test_a_phone_cameras_multi_picture_jpeg_is_read_as_jpeg() -> None:
    buffer = io.BytesIO()
    first, second = Image.new("RGB", (8, 8), "red"), Image.new("RGB", (8, 8), "blue")
    first.save(buffer, format="MPO", save_all=True, append_images=[second])
    loaded = await load_image(data_uri(buffer.getvalue(), "image/jpeg"), ImagePolicy(), PART)
    assert loaded.mime == "image/jpeg" and pixel(loaded.image)[0] > 200
