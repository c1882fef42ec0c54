"""The optional features whose dependencies are pip extras of modelpool, not core
dependencies (a user who only wants embeddings needs no MCP SDK and no FFmpeg), and the one
way code asks for them: `require()` before the import, so a feature used without its extra
is a clear error naming the extra (`ExtraNotInstalled`, 501) instead of an ImportError."""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from modelpool.errors import ExtraNotInstalled


@dataclass(frozen=True)
class Extra:
    name: str
    """The extra's name: `pip install 'modelpool[<name>]'`."""
    module: str
    """The top-level module it brings that the feature imports."""
    feature: str
    """What needs it, in words, for the error message."""

    def installed(self) -> bool:
        """Whether `module` imports (cheap after the first time: then it is in sys.modules)."""
        try:
            importlib.import_module(self.module)
        except ImportError:
            return False
        return True

    def require(self) -> None:
        """Raise `ExtraNotInstalled` unless the extra is installed."""
        if not self.installed():
            raise ExtraNotInstalled(self.feature, self.name)

    @property
    def missing(self) -> str:
        """The message `require` raises, for a log line at start-up."""
        return ExtraNotInstalled(self.feature, self.name).message


AUDIO = Extra("audio", "av", "Decoding uploaded audio and encoding speech as mp3, opus, flac or aac (PyAV)")
VIDEO = Extra("video", "av", "Reading video content parts (video_url), checked and sampled into frames (PyAV)")
MCP = Extra("mcp", "mcp", "The MCP server at /mcp")
