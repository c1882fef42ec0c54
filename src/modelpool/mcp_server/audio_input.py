"""The audio a `transcribe` call names: base64 in the call, or a file under the directories
the server allows (`server.allowed_local_media_dirs`, as for file:// images)."""

from __future__ import annotations

import asyncio
import base64
import binascii
from pathlib import Path

from modelpool.config.schema import ServerConfig
from modelpool.errors import InvalidRequest, RequestTooLarge


async def read_audio(audio_base64: str | None, path: str | None, config: ServerConfig) -> bytes:
    if (audio_base64 is None) == (path is None):
        raise InvalidRequest("give the audio as exactly one of audio_base64 or path", param="audio_base64")
    if audio_base64 is not None:
        data = _decoded(audio_base64)
        if len(data) > config.max_upload_bytes:
            raise _too_large(config, "audio_base64")
        return data
    assert path is not None
    return await asyncio.to_thread(_read_allowed, Path(path), config)


def _decoded(text: str) -> bytes:
    """Base64, or a data: URI holding base64 (what a client that has a file as a URI sends)."""
    if text.startswith("data:"):
        header, _, text = text.partition(",")
        if not header.endswith(";base64"):
            raise InvalidRequest("a data: URI must hold base64 (data:audio/wav;base64,...)", param="audio_base64")
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequest("audio_base64 is not valid base64", param="audio_base64") from None
    if not data:
        raise InvalidRequest("audio_base64 holds no audio", param="audio_base64")
    return data


def _read_allowed(path: Path, config: ServerConfig) -> bytes:
    """Links are resolved before the check, so one inside an allowed directory cannot point
    outside it."""
    resolved = path.expanduser().resolve()
    if not any(resolved.is_relative_to(root.expanduser().resolve()) for root in config.allowed_local_media_dirs):
        raise InvalidRequest("audio files may be read only under server.allowed_local_media_dirs", param="path")
    if resolved.exists() and not resolved.is_file():  # a FIFO or a device would block a thread, or never end
        raise InvalidRequest("path must name a regular file", param="path")
    try:
        with resolved.open("rb") as audio:
            data = audio.read(config.max_upload_bytes + 1)  # bounded even if the file grows meanwhile
    except OSError as exc:
        raise InvalidRequest(f"the audio file cannot be read: {exc.strerror}", param="path") from None
    if len(data) > config.max_upload_bytes:
        raise _too_large(config, "path")
    return data


def _too_large(config: ServerConfig, param: str) -> RequestTooLarge:
    return RequestTooLarge(f"the audio is over {config.max_upload_bytes} bytes (server.max_upload_bytes)", param=param)
