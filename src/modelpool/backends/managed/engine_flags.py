"""Which engine flags an admin's load-time override may add to `extra_args`.

The config's `extra_args` are the operator's word and go to the engine as written. An
override (POST /v1/admin/models/{id}/load) holds an admin key, not the machine: it may tune
how the engine runs (batch sizes, threads, cache types, memory locking) but must not widen
what the config allows: load another model, bind another address or port, write files,
run remote code, set keys, swap templates, or set what modelpool itself sets from options
(context, parallelism, the port...). Deny lists always miss a flag (and argparse accepts
any unambiguous prefix of one), so each engine has an allow list: a flag not on it is a
400 naming it. An override keeps the config's own `extra_args` in front, unchanged, and
may only add to them (dropping one, `--api-key` say, could widen too).

The override's extra_args are read as the engine's parser reads them: `--flag value`,
`--flag=value`; a token that is not a listed flag must be the value of the listed flag
before it, and a value never looks like a flag (so `-b --host` cannot smuggle one in).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationInfo

_NUMBER = re.compile(r"^-?\d+(\.\d+)?$")
OVERRIDE_OF = "override_of"
"""The validation context's key for the configured options an override would replace
(`Options.model_validate(candidate, context={OVERRIDE_OF: configured})`): a validator that
finds them refuses what would widen them."""


def configured_options(info: ValidationInfo) -> Any:
    """The configured options when validating an admin's override, else None (the config)."""
    return info.context.get(OVERRIDE_OF) if isinstance(info.context, dict) else None


@dataclass(frozen=True)
class FlagPolicy:
    """An engine's override-safe flags: name → whether it takes a value."""

    engine: str
    flags: dict[str, bool]
    underscores_are_dashes: bool = False
    """vLLM's parser reads `--max_num_seqs` as `--max-num-seqs`."""

    def canonical(self, flag: str) -> str:
        if self.underscores_are_dashes and flag.startswith("--"):
            return "--" + flag[2:].replace("_", "-")
        return flag

    def problem(self, configured: Sequence[str], given: Sequence[str]) -> str | None:
        """Why an override's `given` extra_args widen `configured` ones; None if they do not."""
        if list(given[: len(configured)]) != list(configured):
            return (f"an override keeps the configured extra_args {list(configured)} in front, unchanged, "
                    "and may only add flags after them")  # fmt: skip
        return self._added_problem(list(given[len(configured) :]))

    def _added_problem(self, added: list[str]) -> str | None:
        expects_value = False
        for token in added:
            if expects_value:
                expects_value = False
                if token.startswith("-") and not _NUMBER.match(token):
                    return f"'{token}' stands where a value belongs; a value may not look like a flag"
                continue
            if not token.startswith("-") or _NUMBER.match(token):
                return f"'{token}' is neither an allowed flag nor the value of one"
            name, has_inline, value = token.partition("=")
            takes_value = self.flags.get(self.canonical(name))
            if takes_value is None:
                return self._not_allowed(name)
            if has_inline and (not takes_value or (value.startswith("-") and not _NUMBER.match(value))):
                return f"'{token}': {name} takes {'a value that is not a flag' if takes_value else 'no value'}"
            expects_value = takes_value and not has_inline
        return "extra_args end with a flag that needs a value" if expects_value else None

    def _not_allowed(self, flag: str) -> str:
        return (f"'{flag}' may not be set by an override of {self.engine}'s extra_args (it could change the model, "
                "the address, files, keys, templates or what modelpool sets from the options); the config may "
                f"set it. An override may add: {', '.join(sorted(self.flags))}")  # fmt: skip


def _flags(with_value: str, switches: str = "") -> dict[str, bool]:
    return {**dict.fromkeys(with_value.split(), True), **dict.fromkeys(switches.split(), False)}


LLAMA_SERVER = FlagPolicy(
    "llama-server",
    _flags(
        "-b --batch-size -ub --ubatch-size -tb --threads-batch -ctk --cache-type-k -ctv --cache-type-v "
        "-dt --defrag-thold --cache-reuse -sm --split-mode -ts --tensor-split -mg --main-gpu --numa --prio",
        "--mlock --no-mmap -cb --cont-batching -nocb --no-cont-batching -nkvo --no-kv-offload --no-warmup "
        "--swa-full -kvu --kv-unified --no-context-shift --context-shift",
    ),
)
"""llama.cpp's `llama-server` (common/arg.cpp): performance and memory, nothing else."""

LLAMA_CPP_PYTHON = FlagPolicy(
    "llama_cpp.server",
    _flags(
        "--n_batch --n_ubatch --n_threads_batch --use_mmap --use_mlock --offload_kqv --type_k --type_v "
        "--split_mode --main_gpu --numa --verbose --mul_mat_q"
    ),
)
"""llama-cpp-python's server: every flag takes a value there (booleans as `true`/`false`)."""

VLLM = FlagPolicy(
    "vLLM",
    _flags(
        "--max-num-batched-tokens --block-size --swap-space --cpu-offload-gb --kv-cache-dtype "
        "--scheduling-policy --max-num-partial-prefills --max-long-partial-prefills "
        "--long-prefill-token-threshold --seed --max-seq-len-to-capture",
        "--enable-prefix-caching --no-enable-prefix-caching --enable-chunked-prefill "
        "--no-enable-chunked-prefill --enforce-eager --disable-log-stats",
    ),
    underscores_are_dashes=True,
)
"""`vllm serve`: scheduling, caching and memory knobs, nothing that names a file or a model."""
