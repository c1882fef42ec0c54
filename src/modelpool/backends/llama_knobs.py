"""The llama.cpp tuning knobs both llama.cpp backends share (`llama_cpp` in process,
`llama_server` as an engine process): KV-cache types and flash attention, with the rule
llama.cpp itself enforces between them.

The names and numbers are the vendored llama.cpp's (llama-cpp-python 0.3.36):
`kv_cache_types` in common/arg.cpp lists the cache types `-ctk`/`-ctv` take, ggml.h gives
each its `ggml_type` number (what llama_cpp.server's `--type_k` and the context params
take), and llama-context.cpp refuses a quantized V cache with flash attention off.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

KvCacheType = Literal["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"]
"""llama.cpp's allowed KV-cache types (common/arg.cpp `kv_cache_types`)."""

GGML_TYPE: dict[str, int] = {
    "f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "iq4_nl": 20, "bf16": 30,
}  # fmt: skip
"""Each cache type's `enum ggml_type` value (ggml.h)."""

QUANTIZED: frozenset[str] = frozenset({"q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"})

FlashAttention = Literal["on", "off", "auto"]
"""llama.cpp's `-fa on|off|auto` (`LLAMA_FLASH_ATTN_TYPE_ENABLED/DISABLED/AUTO`)."""

FLASH_ATTN_TYPE: dict[str, int] = {"auto": -1, "off": 0, "on": 1}


def flash_attention_value(value: Any) -> Any:
    """A config's `true`/`false` (the option's former boolean form) as `on`/`off`."""
    if isinstance(value, bool):
        return "on" if value else "off"
    return value


def quantized_v_problem(type_v: str | None, flash_attention: str) -> str | None:
    """Why llama.cpp would refuse this V-cache type with this flash attention setting, or
    None. A quantized V cache needs flash attention; `auto` turns it on for one."""
    if type_v in QUANTIZED and flash_attention == "off":
        return (f"type_v '{type_v}' (a quantized V cache) needs flash attention: llama.cpp refuses it with "
                "flash attention off; set flash_attention to on (or auto where the engine has it)")  # fmt: skip
    return None


@dataclass(frozen=True)
class AttentionSettings:
    """KV-cache types and flash attention for a llama.cpp context (in process)."""

    type_k: str | None = None
    type_v: str | None = None
    flash_attention: str = "auto"

    def apply(self, params: Any) -> None:
        """Set them on a `llama_context_params` (None: llama.cpp's default, f16)."""
        params.flash_attn_type = FLASH_ATTN_TYPE[self.flash_attention]
        if self.type_k is not None:
            params.type_k = GGML_TYPE[self.type_k]
        if self.type_v is not None:
            params.type_v = GGML_TYPE[self.type_v]

    def describe(self) -> str:
        return f"K cache {self.type_k or 'f16'}, V cache {self.type_v or 'f16'}, flash attention {self.flash_attention}"


DEFAULT_ATTENTION = AttentionSettings()
"""llama.cpp's own defaults: f16 caches, flash attention auto."""
