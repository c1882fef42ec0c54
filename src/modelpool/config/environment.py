"""The one place outside the config loader that reads the process environment: secrets that
the config names by variable (`api_key_env: NAME`, never logged or echoed), the default
state directory, and the environment handed on to child processes."""

from __future__ import annotations

import os
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
                   "OMP_", "KMP_", "MKL_", "OPENBLAS_", "NCCL_", "VLLM_", "TORCHINDUCTOR_")  # fmt: skip
"""Prefixes of the same: device selection (CUDA_VISIBLE_DEVICES, HIP_VISIBLE_DEVICES, ...),
thread pools (OMP_NUM_THREADS, ...), and the engines' own settings (GGML_*, VLLM_*; a key
modelpool gives an engine is set after these, over whatever came)."""

SECRET_SUFFIXES = ("_KEY", "_TOKEN", "_SECRET", "_PASSWORD", "_CREDENTIALS")
"""A name that looks like a secret is not taken by a prefix (VLLM_API_KEY): only when named."""


def child_environment(extra: Mapping[str, str]) -> dict[str, str]:
    """modelpool's own environment with `extra` on top, for a process it spawns that the
    operator named (a stack's service: a modelpool among them reads its keys from it)."""
    return {**os.environ, **extra}


def engine_environment(extra: Mapping[str, str], passed: Iterable[str] = ()) -> dict[str, str]:
    """What an engine process gets: the allowlist above, the variables named in `passed`,
    and `extra` on top. Never the rest: the variables modelpool's API keys and upstream
    keys are read from stay with modelpool, and names an engine would read as settings
    (llama_cpp.server takes HOST, PORT, MODEL, API_KEY from its environment) cannot widen
    what the config says."""
    wanted = set(passed)
    kept = {
        name: value
        for name, value in os.environ.items()
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
