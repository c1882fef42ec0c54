"""/v1/models, health, readiness, metrics, request ids and access logs on the real app."""

from __future__ import annotations

import logging
import re
from typing import Any

import httpx
import openai
import pytest

import modelpool
from tests.conftest import CHAT_MODEL, CT2_MODEL, EMBED_MODEL, HF_MODEL, STARTER_IDS, STT_MODEL, TTS_MODEL


async def test_models_list_and_retrieve(oai: openai.AsyncOpenAI, http: httpx.AsyncClient) -> None:
    page = await oai.models.list()
    models = {m.id: m for m in page.data}
    assert set(models) == STARTER_IDS
    chat = models[CHAT_MODEL]
    assert chat.object == "model" and chat.owned_by == "HuggingFaceTB" and chat.created > 1_600_000_000
    extra = chat.model_extra or {}
    assert extra["state"] == "ready"
    assert extra["tasks"] == ["chat", "completion", "scoring"]
    one = await oai.models.retrieve(EMBED_MODEL)
    assert one.id == EMBED_MODEL and (one.model_extra or {})["tasks"] == ["embedding"]
    by_alias = (await http.get("/v1/models/sentence-transformers/all-MiniLM-L6-v2")).json()
    assert by_alias["id"] == EMBED_MODEL
    with pytest.raises(openai.NotFoundError):
        await oai.models.retrieve("missing-model")


async def test_health_and_readiness(http: httpx.AsyncClient) -> None:
    assert (await http.get("/healthz")).json() == {"status": "ok", "version": modelpool.__version__}
    ready = await http.get("/readyz")
    assert ready.status_code == 200
    states = {
        CHAT_MODEL: "ready",
        EMBED_MODEL: "ready",
        HF_MODEL: "unloaded",
        CT2_MODEL: "unloaded",
        STT_MODEL: "ready",
        TTS_MODEL: "ready",
        "whisper-base": "unloaded",  # loads on first use
        "kokoro-82m": "unloaded",
    }
    assert ready.json() == {"status": "ready", "models": states}


async def test_request_id_is_echoed_or_made(http: httpx.AsyncClient) -> None:
    given = await http.get("/healthz", headers={"X-Request-ID": "trace-abc-123"})
    assert given.headers["x-request-id"] == "trace-abc-123"
    made = await http.get("/healthz")
    assert re.fullmatch(r"[0-9a-f]{32}", made.headers["x-request-id"])
    error = await http.post("/v1/embeddings", json={"model": "nope", "input": "a"}, headers={"X-Request-ID": "e-1"})
    assert error.status_code == 404 and error.headers["x-request-id"] == "e-1"


async def test_access_log_line_carries_the_request_id(http: httpx.AsyncClient, caplog: pytest.LogCaptureFixture):
    with caplog.at_level(logging.INFO, logger="modelpool.access"):
        await http.post(
            "/v1/embeddings", json={"model": EMBED_MODEL, "input": "log me"}, headers={"X-Request-ID": "log-me-42"}
        )
    lines = [r for r in caplog.records if r.name == "modelpool.access" and getattr(r, "request_id", "") == "log-me-42"]
    assert len(lines) == 1
    record: Any = lines[0]  # the access log's fields are set on the record at runtime (logging's `extra`)
    assert record.status == 200 and record.model == EMBED_MODEL and record.path == "/v1/embeddings"


def metric(text: str, name: str, **labels: str) -> float:
    """The value of one sample in Prometheus text format (0 when absent)."""
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def test_metrics_count_requests_tokens_latency_and_state(http: httpx.AsyncClient) -> None:
    before = (await http.get("/metrics")).text
    reply = (
        await http.post(
            "/v1/chat/completions",
            json={"model": CHAT_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5},
        )
    ).json()
    await http.post("/v1/chat/completions", json={"model": CHAT_MODEL, "messages": []})
    after_response = await http.get("/metrics")
    after = after_response.text
    assert after_response.headers["content-type"].startswith("text/plain")
    route = "/v1/chat/completions"

    def delta(name: str, **labels: str) -> float:
        return metric(after, name, **labels) - metric(before, name, **labels)

    assert delta("modelpool_requests_total", model=CHAT_MODEL, route=route, status="200") == 1
    assert delta("modelpool_requests_total", model=CHAT_MODEL, route=route, status="400") == 1
    assert delta("modelpool_request_duration_seconds_count", model=CHAT_MODEL, route=route) == 2
    assert delta("modelpool_input_tokens_total", model=CHAT_MODEL) == reply["usage"]["prompt_tokens"]
    assert delta("modelpool_output_tokens_total", model=CHAT_MODEL) == reply["usage"]["completion_tokens"]
    assert metric(after, "modelpool_model_state", model=CHAT_MODEL, state="ready") == 1
    assert metric(after, "modelpool_model_state", model=CHAT_MODEL, state="loading") == 0
    assert delta("modelpool_request_duration_seconds_bucket", model=CHAT_MODEL, route=route, le="+Inf") == 2
    await http.post("/v1/embeddings", json={"model": "made-up-name", "input": "a"})
    final = (await http.get("/metrics")).text
    assert "made-up-name" not in final
    assert metric(final, "modelpool_requests_total", model="unknown", route="/v1/embeddings", status="404") >= 1
