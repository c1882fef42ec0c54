"""The one place outside the config loader that reads the process environment: secrets that
the config names by variable (`api_key_env: NAME`, never logged or echoed), the default
state directory, the environment handed on to child processes, and the OpenMP wait
settings a serving process starts with."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

STATE_DIR_ENV = "MODELPOOL_STATE_DIR"


def secret(variable: str) -> str | None:
    """The value of the environment variable the config names for a secret (None when unset
    or empty)."""
    return os.environ.get(variable) or None


def default_state_dir() -> Path:
    """$MODELPOOL_STATE_DIR, else $XDG_STATE_HOME/modelpool, else ~/.local/state/modelpool."""
    explicit = os.environ.get(STATE_DIR_ENV)
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "modelpool"


ENGINE_VARIABLES = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TEMP", "TMP", "LD_LIBRARY_PATH",
    "XDG_CACHE_HOME",  # where Hugging Face and torch caches live by default
    "HF_HOME", "HF_HUB_CACHE", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "HF_ENDPOINT", "HF_HUB_ENABLE_HF_TRANSFER",
    "HF_HUB_DISABLE_TELEMETRY", "TRANSFORMERS_OFFLINE", "TRANSFORMERS_CACHE", "TORCH_HOME", "TRITON_CACHE_DIR",
    "GPU_DEVICE_ORDINAL", "ONEAPI_DEVICE_SELECTOR",
    # Reaching the hub from behind a corporate proxy, with its CA (vLLM downloads by repo id).
    "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "no_proxy", "all_proxy",
    "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE",
    "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF",
})  # fmt: skip
"""Variables of modelpool's environment an engine process gets: locale, paths, caches and
offline switches, proxies and CA bundles. Secrets such as HF_TOKEN only when named in
`options.pass_env`. Not PYTHONPATH: an engine runs in its own interpreter's environment (vLLM's
venv), where modelpool's packages would only get in the way; `options.env` can set one."""

ENGINE_PREFIXES = ("LC_", "CUDA_", "NVIDIA_", "HIP_", "ROCR_", "ROCM_", "HSA_", "ZE_", "GGML_",
                   "OMP_", "GOMP_", "KMP_", "MKL_", "OPENBLAS_", "NCCL_", "VLLM_", "TORCHINDUCTOR_")  # fmt: skip
"""Prefixes of the same: device selection (CUDA_VISIBLE_DEVICES, HIP_VISIBLE_DEVICES, ...),
thread pools (OMP_NUM_THREADS, GOMP_SPINCOUNT, ...), and the engines' own settings (GGML_*, VLLM_*; a key
modelpool gives an engine is set after these, over whatever came)."""

SECRET_SUFFIXES = ("_KEY", "_TOKEN", "_SECRET", "_PASSWORD", "_CREDENTIALS")
"""A name that looks like a secret is not taken by a prefix (VLLM_API_KEY): only when named."""


def child_environment(extra: Mapping[str, str]) -> dict[str, str]:
    """modelpool's own environment with `extra` on top, for a process it spawns that the
    operator named (a stack's service: a modelpool among them reads its keys from it).
    Not the OpenMP wait settings modelpool gave itself: they are sized for its own threads."""
    return {**_operators_environment(), **extra}


def engine_environment(extra: Mapping[str, str], passed: Iterable[str] = ()) -> dict[str, str]:
    """What an engine process gets: the allowlist above, the variables named in `passed`,
    and `extra` on top. Never the rest: the variables modelpool's API keys and upstream
    keys are read from stay with modelpool, and names an engine would read as settings
    (llama_cpp.server takes HOST, PORT, MODEL, API_KEY from its environment) cannot widen
    what the config says."""
    wanted = set(passed)
    kept = {
        name: value
        for name, value in _operators_environment().items()
        if name in wanted
        or name in ENGINE_VARIABLES
        or (name.startswith(ENGINE_PREFIXES) and not name.upper().endswith(SECRET_SUFFIXES))
    }
    return {**kept, **extra}


CONFIG_FILE_ENV = "MODELPOOL_CONFIG"


def config_file_named() -> Path | None:
    """The config file MODELPOOL_CONFIG names (what `--config` defaults to), if any."""
    value = os.environ.get(CONFIG_FILE_ENV)
    return Path(value) if value else None


OPENMP_WAITS = {"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": "300000"}
"""How long an OpenMP thread of a serving process spins before it sleeps: libgomp's own
300,000 spins, and 1,000 instead of 100 while the process holds more OpenMP threads than
cores (ACTIVE raises that one; the explicit count keeps ACTIVE from spinning for minutes).

PyTorch, llama.cpp and CTranslate2 all run on GNU OpenMP (one runtime for the process, or
one per copy of libgomp: each reads these), and llama.cpp meets its threads at an OpenMP
barrier after every operator, hundreds of times a token. Once two engines hold pools (the
starter chat model and Whisper in `make serve`), the process holds more OpenMP threads than
cores, and with 100 spins every barrier sleeps and wakes: the chat model made 46 tokens/s
in `make serve` against 104 served alone; with 1,000 spins, 106, and Whisper took 0.58 s
for 23 s of speech against 0.80 (2 cores, 2026-11-29, `benchmarks/bench_openmp_waits.py`).
Beside other busy processes both measured alike, and a process within its cores (one
engine with a pool) spins as libgomp's defaults do: a shorter spin count measured anywhere
from 0.2× to 3× those defaults there, run to run. The transformers engine (PyTorch on
oneDNN) measured the same with and without them. Linux only: elsewhere PyTorch runs on
LLVM's OpenMP, where ACTIVE means spinning without end."""

_openmp_waits_set: dict[str, str] = {}


def apply_openmp_waits() -> dict[str, str]:
    """Give this process `OPENMP_WAITS` before an engine loads OpenMP (each libgomp reads them
    once, when it is loaded); returns what it set. Nothing when the operator set either
    variable, off Linux, or when OpenMP is already loaded (too late to matter). What it set
    stays out of every child process's environment (`engine_environment`, `child_environment`)."""
    if not sys.platform.startswith("linux") or any(name in os.environ for name in OPENMP_WAITS):
        return {}
    if openmp_loaded():
        return {}
    os.environ.update(OPENMP_WAITS)
    _openmp_waits_set.update(OPENMP_WAITS)
    return dict(OPENMP_WAITS)


def openmp_loaded() -> bool:
    """Whether a GNU OpenMP runtime is mapped into this process (PyTorch, llama.cpp or
    CTranslate2 imported)."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            return any("libgomp" in line for line in maps)
    except OSError:
        return False


def _operators_environment() -> dict[str, str]:
    """os.environ without the OpenMP wait settings `apply_openmp_waits` gave this process."""
    return {
        name: value
        for name, value in os.environ.items()
        if not (name in _openmp_waits_set and _openmp_waits_set[name] == value)
    }
