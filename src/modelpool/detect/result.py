"""What detection found: the backend that runs a model, what it serves, the options it
needs, and the facts `modelpool show` prints."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from modelpool.tasks import Task


@dataclass(frozen=True)
class Detected:
    backend: str
    """A name from the backend registry (`llama_cpp`, `transformers`, ...)."""
    tasks: tuple[Task, ...]
    options: Mapping[str, Any] = field(default_factory=dict)
    """Backend options the files call for (`{"vision": True}`); a config entry's own win."""
    reason: str = ""
    """One line: what was seen ("GGUF llama, Q4_1, chat template")."""
    weights: str | None = None
    """The file the backend loads, relative to the view, when the view is a folder but the
    backend takes one file (a GGUF, a voice's .onnx); None: the view itself."""
    file_options: tuple[str, ...] = ()
    """Options whose values are file names relative to the view (`mmproj`): whoever knows
    where the view's files are makes them paths."""
    architecture: str | None = None
    name: str | None = None
    context_length: int | None = None
    quantization: str | None = None
    """"Q4_K_M", "F16", "float32", ... when the files say."""
    size_label: str | None = None
    """The parameter count as the files say it ("135M"), when they do."""

    def facts(self) -> dict[str, str | int]:
        """The detected facts that are known, for display."""
        known = {
            "architecture": self.architecture,
            "name": self.name,
            "context_length": self.context_length,
            "quantization": self.quantization,
            "parameters": self.size_label,
        }
        return {key: value for key, value in known.items() if value is not None}
