"""The typed tuning knobs of a `llama_server` model, rendered as each runner's own flags.

llama.cpp's `llama-server` (the `binary` runner) and llama-cpp-python's server (`python -m
llama_cpp.server`) take different flags, and the second lacks most of these: a knob its
runner has no flag for is a config error naming it, never dropped silently. Every flag
name was checked against the vendored llama.cpp of llama-cpp-python 0.3.36
(common/arg.cpp) and that package's llama_cpp/server/settings.py; llama-server of that
version has no draft context size flag (the draft model gets the target's context).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from modelpool.backends.llama_knobs import GGML_TYPE


@dataclass(frozen=True)
class Knob:
    native: tuple[str, ...]
    """llama-server's flag and its aliases, the first one rendered."""
    python: str | None = None
    """llama_cpp.server's flag; None: it has none."""
    render: Callable[[Any], str] = str
    render_python: Callable[[Any], str] = str
    native_prefix: tuple[str, ...] = ()
    """Flags rendered before the knob's own on llama-server (`--spec-type ngram-simple`)."""
    python_prefix: tuple[str, ...] = ()


def _bool_flag(value: Any) -> str:
    return "true" if value == "on" else "false"


def _layers(value: Any) -> str:
    return "all" if value == -1 else str(value)  # -ngld takes a count, `auto` or `all`


KNOBS: dict[str, Knob] = {
    "flash_attention": Knob(("-fa", "--flash-attn"), "--flash_attn", render_python=_bool_flag),
    "type_k": Knob(("-ctk", "--cache-type-k"), "--type_k", render_python=lambda v: str(GGML_TYPE[v])),
    "type_v": Knob(("-ctv", "--cache-type-v"), "--type_v", render_python=lambda v: str(GGML_TYPE[v])),
    "draft_model": Knob(("-md", "--spec-draft-model", "--model-draft")),
    "draft_max_tokens": Knob(("--spec-draft-n-max",)),
    "draft_min_tokens": Knob(("--spec-draft-n-min",)),
    "draft_p_min": Knob(("--spec-draft-p-min", "--draft-p-min")),
    "draft_gpu_layers": Knob(("-ngld", "--spec-draft-ngl", "--gpu-layers-draft"), render=_layers),
    "prompt_lookup_tokens": Knob(("--spec-ngram-simple-size-m",), "--draft_model_num_pred_tokens",
                                 native_prefix=("--spec-type", "ngram-simple"),
                                 python_prefix=("--draft_model", "prompt-lookup-decoding")),
    "image_min_tokens": Knob(("--image-min-tokens",)),
    "image_max_tokens": Knob(("--image-max-tokens",)),
    "reasoning_format": Knob(("--reasoning-format",)),
    "reasoning_budget": Knob(("--reasoning-budget",)),
}
"""Option name → its flags, in the order they are rendered."""

DRAFT_SETTINGS = ("draft_max_tokens", "draft_min_tokens", "draft_p_min", "draft_gpu_layers")
IMAGE_BUDGET = ("image_min_tokens", "image_max_tokens")


def knob_argv(values: Mapping[str, Any], *, native: bool) -> list[str]:
    """The flags of the knobs that are set (not None), for the runner."""
    argv: list[str] = []
    for name, knob in KNOBS.items():
        value = values.get(name)
        if value is None:
            continue
        if native:
            argv += [*knob.native_prefix, knob.native[0], knob.render(value)]
        elif knob.python is not None:
            argv += [*knob.python_prefix, knob.python, knob.render_python(value)]
    return argv


def runner_problem(values: Mapping[str, Any], *, native: bool) -> str | None:
    """Why a knob that is set cannot be passed to this runner, or None."""
    if native:
        return None
    missing = [name for name, knob in KNOBS.items() if values.get(name) is not None and knob.python is None]
    if missing:
        return (f"{', '.join(missing)}: llama_cpp.server (the runner without `binary`) has no such setting; "
                "set `binary` to llama.cpp's llama-server to use it")  # fmt: skip
    if values.get("flash_attention") == "auto":
        return "flash_attention: llama_cpp.server takes on or off (its --flash_attn is a boolean), not auto"
    return None


def pairing_problem(values: Mapping[str, Any], *, has_mmproj: bool) -> str | None:
    """A knob that needs another one, or a min above its max; None when they fit."""
    drafting = [name for name in DRAFT_SETTINGS if values.get(name) is not None]
    if values.get("draft_model") is None and (set_ := drafting):
        return f"{', '.join(set_)}: speculative decoding settings need `draft_model`"
    if values.get("draft_model") is not None and values.get("prompt_lookup_tokens") is not None:
        return "draft_model and prompt_lookup_tokens: choose one way to draft tokens"
    if not has_mmproj and (set_ := [name for name in IMAGE_BUDGET if values.get(name) is not None]):
        return f"{', '.join(set_)}: an image-token budget needs a vision projector (`mmproj`)"
    for low, high in (("draft_min_tokens", "draft_max_tokens"), IMAGE_BUDGET):
        if values.get(low) is not None and values.get(high) is not None and values[low] > values[high]:
            return f"{low} ({values[low]}) is above {high} ({values[high]})"
    return None


def duplicate_problem(values: Mapping[str, Any], extra_args: list[str], *, native: bool) -> str | None:
    """A knob that is set and also given as a flag in `extra_args` (the last would win
    silently): set it once."""
    given = {arg.partition("=")[0] for arg in extra_args}
    for name, knob in KNOBS.items():
        flags = (*knob.native, *knob.native_prefix[:1]) if native else (knob.python, *knob.python_prefix[:1])
        if values.get(name) is not None and (clash := given.intersection(f for f in flags if f)):
            return f"{name} is set and extra_args give {', '.join(sorted(clash))} too: set it once"
    return None
