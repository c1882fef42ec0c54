from __future__ import annotations

import httpx
import openai

from tests.ray_serve.cluster import RayModelpool


def test_chat_through_the_ingress(ray_pool: RayModelpool) -> None:
    client = openai.OpenAI(base_url=ray_pool.base_url + "/v1", api_key="none", max_retries=0, timeout=60)
    reply = client.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "Say hi"}], max_tokens=8, temperature=0
    )
    assert reply.choices[0].message.content
    print(httpx.get(ray_pool.base_url + "/v1/admin/models").json())
