"""Images from a request's content parts: a `data:` URI always; an `http(s)://` URL only when
remote images are allowed, fetched under a guard; a `file://` URL only under allowed
directories. Every problem is the request's: a 400 (413 for size) naming the part.

Decoding is CPU work whose size the client picks, so base64 and Pillow run on the bounded
image-decode threads (`offload.IMAGE_DECODES`), never on the event loop; an image's size is
read from its header before its pixels are decoded.

The guard against server-side request forgery: a URL whose host resolves to a loopback,
private, shared, link-local (cloud metadata at 169.254.169.254), multicast, reserved or
unspecified address is refused, unless its host is explicitly allowed. The check is on the address the
connection really uses (a resolver that refuses, so DNS cannot answer differently to the
check and to the connection), and on every redirect, which is followed by hand.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import io
import ipaddress
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urljoin, urlsplit

from aiohttp.resolver import ThreadedResolver

from modelpool.errors import InvalidRequest, RequestTooLarge
from modelpool.offload import IMAGE_DECODES

if TYPE_CHECKING:
    from PIL import Image

FORMATS = {"PNG": "image/png", "JPEG": "image/jpeg", "MPO": "image/jpeg", "WEBP": "image/webp", "GIF": "image/gif"}
"""What Pillow decodes for us, and the MIME type each is forwarded as (MPO: a phone camera's
multi-picture JPEG)."""
REDIRECT_STATUSES = {301, 302, 303, 307, 308}


@dataclass(frozen=True)
class ImagePolicy:
    """Where images may come from, and how big they may be (from the server config)."""

    allow_remote: bool = False
    allowed_hosts: frozenset[str] = frozenset()
    """Hosts fetched even though they resolve to a private address (an internal media server)."""
    local_dirs: tuple[Path, ...] = ()
    max_bytes: int = 20 * 1024 * 1024
    max_pixels: int = 40_000_000
    max_images: int = 16
    """Most images one request may carry, whatever the model (`server.max_images_per_request`)."""
    max_request_pixels: int = 80_000_000
    """Most pixels all the images of one request may have together."""
    fetch_timeout_s: float = 10.0
    max_redirects: int = 5
    kind: str = "image"
    """What is read under this policy, for messages ("image", "video")."""
    bytes_setting: str = "server.max_image_bytes"
    """The setting that sets `max_bytes`, named by a 413."""


@dataclass(frozen=True)
class LoadedImage:
    """An image as decoded (RGB, first frame of an animation) and its original bytes."""

    image: Image.Image = field(repr=False)
    data: bytes = field(repr=False)
    mime: str

    def data_uri(self) -> str:
        return f"data:{self.mime};base64,{base64.b64encode(self.data).decode('ascii')}"


async def load_image(url: str, policy: ImagePolicy, param: str) -> LoadedImage:
    """The image a content part's URL names, decoded; errors name `param`."""
    data = await image_bytes(url, policy, param)
    image, mime = await IMAGE_DECODES.run(decode, data, policy.max_pixels, param)
    return LoadedImage(image, data, mime)


async def image_bytes(url: str, policy: ImagePolicy, param: str) -> bytes:
    """The encoded bytes of the image a content part's URL names (not decoded yet)."""
    try:
        return await _image_bytes(url, policy, param)
    except ValueError as exc:  # a URL or path that cannot even be parsed (`http://[::1/`, a NUL byte)
        raise InvalidRequest(f"the {policy.kind} URL is malformed: {exc}", param=param) from None


async def _image_bytes(url: str, policy: ImagePolicy, param: str) -> bytes:
    scheme = urlsplit(url).scheme.lower()
    if scheme == "data":
        return await IMAGE_DECODES.run(data_uri_bytes, url, policy, param)
    if scheme in ("http", "https"):
        if not policy.allow_remote:
            raise InvalidRequest(f"remote {policy.kind} URLs are off on this server (server.allow_remote_images); "
                                 f"send the {policy.kind} as a data: URI", param=param)  # fmt: skip
        return await fetch(url, policy, param)
    if scheme == "file":
        return await asyncio.to_thread(read_local, url, policy, param)
    raise InvalidRequest(f"a {policy.kind} URL must be data:, http(s): or file:, not {scheme or 'empty'}:",
                         param=param)  # fmt: skip


def data_uri_bytes(url: str, policy: ImagePolicy, param: str) -> bytes:
    header, comma, payload = url.partition(",")
    if not comma or not header.lower().endswith(";base64"):
        raise InvalidRequest(f"a {policy.kind} data URI must be base64: data:{policy.kind}/...;base64,...", param=param)
    if len(payload) * 3 // 4 > policy.max_bytes:
        raise RequestTooLarge(
            f"the {policy.kind} is over {policy.max_bytes} bytes ({policy.bytes_setting})", param=param
        )
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequest(f"the {policy.kind} data URI is not valid base64", param=param) from None


def pixels(data: bytes, max_pixels: int, param: str) -> int:
    """An image's pixel count from its header alone (no pixel is decoded), after checking
    its format and its size against `max_pixels`."""
    with _opened(data, max_pixels, param) as opened:
        width, height = opened.size
        return int(width * height)


def decode(data: bytes, max_pixels: int, param: str) -> tuple[Image.Image, str]:
    """Decode with Pillow: PNG, JPEG, WebP, GIF (its first frame), as RGB. The size is
    checked from the header, before the pixels are decoded."""
    from PIL import Image

    with _opened(data, max_pixels, param) as opened:
        try:
            opened.seek(0)
            return opened.convert("RGB"), FORMATS[str(opened.format)]
        except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
            raise InvalidRequest(f"the image cannot be decoded: {exc}", param=param) from None


def _opened(data: bytes, max_pixels: int, param: str) -> Image.Image:
    """The image opened (its header read, no pixels yet), of a supported format and size."""
    from PIL import Image, UnidentifiedImageError

    try:
        opened = Image.open(io.BytesIO(data))
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
        raise InvalidRequest(f"the image cannot be decoded: {exc}", param=param) from None
    width, height = opened.size
    if opened.format not in FORMATS:
        opened.close()
        raise InvalidRequest(f"image format {opened.format} is not supported (PNG, JPEG, WebP, GIF)", param=param)
    if width * height > max_pixels:
        opened.close()
        raise RequestTooLarge(f"the image is {width}x{height}, over {max_pixels} pixels (server.max_image_pixels)",
                              param=param)  # fmt: skip
    return opened


def read_local(url: str, policy: ImagePolicy, param: str) -> bytes:
    """A file:// image, only under one of `policy.local_dirs` (after resolving links)."""
    path = Path(unquote(urlsplit(url).path)).resolve()
    if not any(path.is_relative_to(root.resolve()) for root in policy.local_dirs):
        raise InvalidRequest(f"file:// {policy.kind}s are allowed only under server.allowed_local_media_dirs",
                             param=param)  # fmt: skip
    try:
        size = path.stat().st_size
        if size > policy.max_bytes:
            raise RequestTooLarge(
                f"the {policy.kind} is over {policy.max_bytes} bytes ({policy.bytes_setting})", param=param
            )
        return path.read_bytes()
    except OSError as exc:
        raise InvalidRequest(f"the {policy.kind} file cannot be read: {exc.strerror}", param=param) from None


def is_public(address: str) -> bool:
    """Whether an IP address is one the public internet routes to."""
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if isinstance(ip, ipaddress.IPv6Address) and ip in _IPV4_COMPATIBLE:
        return False  # ::a.b.c.d, deprecated, and routed to the IPv4 address by some stacks
    # is_global is False for private, loopback, link-local, shared (100.64/10), reserved
    # and unspecified addresses alike.
    return ip.is_global and not ip.is_multicast


_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")


class _Refused(OSError):
    """A host resolved to an address the guard refuses (an OSError, so aiohttp reports it
    as a connection error and keeps it as the cause)."""


async def fetch(url: str, policy: ImagePolicy, param: str) -> bytes:
    """GET an image under the guard: public addresses only (or allowed hosts), redirects
    followed by hand and checked again, a deadline for the whole fetch, a byte limit."""
    import aiohttp

    connector = aiohttp.TCPConnector(resolver=_GuardedResolver(policy.allowed_hosts), use_dns_cache=False)

    async def follow() -> bytes:
        target = url
        async with aiohttp.ClientSession(connector=connector) as session:
            for _ in range(policy.max_redirects + 1):
                _check_literal_host(target, policy, param)
                async with session.get(target, allow_redirects=False) as response:
                    if response.status in REDIRECT_STATUSES and "Location" in response.headers:
                        target = urljoin(target, response.headers["Location"])
                        continue
                    if response.status != 200:
                        raise InvalidRequest(f"fetching the {policy.kind} gave HTTP {response.status}", param=param)
                    return await _read_limited(response, policy, param)
            raise InvalidRequest(
                f"fetching the {policy.kind} took more than {policy.max_redirects} redirects", param=param
            )

    try:  # one deadline for the whole fetch, redirects included (aiohttp's is per request)
        return await asyncio.wait_for(follow(), policy.fetch_timeout_s)
    except asyncio.TimeoutError:
        raise InvalidRequest(f"fetching the {policy.kind} took longer than {policy.fetch_timeout_s:g} s",
                             param=param) from None  # fmt: skip
    except (aiohttp.ClientError, OSError) as exc:
        refused = _refusal_in(exc)
        if refused is not None:
            raise InvalidRequest(f"{policy.kind} URL refused: {refused}", param=param) from None
        raise InvalidRequest(f"the {policy.kind} could not be fetched: {exc}", param=param) from None


def _refusal_in(exc: BaseException) -> _Refused | None:
    """The guard's refusal, however aiohttp wrapped it."""
    seen: BaseException | None = exc
    for _ in range(8):  # a few wrappers deep at most; never follow a cycle
        if seen is None or isinstance(seen, _Refused):
            return seen
        seen = getattr(seen, "os_error", None) or seen.__cause__ or seen.__context__
    return None


def _check_literal_host(url: str, policy: ImagePolicy, param: str) -> None:
    """An IP address as the host is never resolved (aiohttp connects to it directly), so it
    is checked here, in the form aiohttp will use: yarl normalises the host first (full-width
    and other Unicode digits become ASCII), which a check on the raw text would miss."""
    from aiohttp.helpers import is_ip_address
    from yarl import URL

    parsed = URL(url)
    host = parsed.raw_host
    if parsed.scheme not in ("http", "https") or not host:
        raise InvalidRequest(f"a {policy.kind} URL (or its redirect) must be http(s) with a host", param=param)
    if host in policy.allowed_hosts or not is_ip_address(host):
        return  # a name: the guarded resolver checks what it resolves to
    try:
        public = is_public(host)
    except ValueError:  # aiohttp would take it for an address that ipaddress does not read
        public = False
    if not public:
        raise InvalidRequest(f"{policy.kind} URL refused: {host} is not a public address", param=param)


async def _read_limited(response: Any, policy: ImagePolicy, param: str) -> bytes:
    limit, too_large = policy.max_bytes, f"the {policy.kind} is over {policy.max_bytes} bytes ({policy.bytes_setting})"
    declared = response.content_length
    if declared is not None and declared > limit:
        raise RequestTooLarge(too_large, param=param)
    body = bytearray()
    async for piece in response.content.iter_chunked(64 * 1024):
        body += piece
        if len(body) > limit:
            raise RequestTooLarge(too_large, param=param)
    return bytes(body)


class _GuardedResolver(ThreadedResolver):
    """aiohttp's resolver, refusing non-public addresses for hosts not explicitly allowed."""

    def __init__(self, allowed_hosts: frozenset[str]) -> None:
        super().__init__()
        self._allowed = allowed_hosts

    async def resolve(self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET) -> list[Any]:
        found = await super().resolve(host, port, family)
        if host in self._allowed:
            return list(found)
        refused = [entry["host"] for entry in found if not is_public(entry["host"])]
        if refused:
            raise _Refused(f"{host} resolves to {refused[0]}, which is not a public address")
        return list(found)
