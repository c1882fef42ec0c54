"""Which model a request that names none uses (`PoolLookup.model_for`), and the routes that
take such bodies (HRM's v1 `/generate` and `/loglikelihood`): the server's default for the
task, else the only model that does it, else a 400 that lists the candidates."""

from __future__ import annotations

import httpx
import pytest
from asgi_lifespan import LifespanManager

from modelpool.backends.registry import model_capabilities
from modelpool.config import load_config
from modelpool.errors import InvalidRequest, UnsupportedTask
from modelpool.inference import EmbeddingRequest
from modelpool.runtime.capacity import Capacity
from modelpool.runtime.eviction import Budget
from modelpool.runtime.pool import ModelPool
from modelpool.runtime.slot import ModelSlot
from modelpool.server.app import create_app
from modelpool.tasks import Task
from tests.fakes import FakeBackend, fake_slot

TEXT = frozenset({Task.COMPLETION, Task.SCORING})


def _pool(*slots: ModelSlot, defaults: dict[Task, str] | None = None) -> ModelPool:
    listed = list(slots)
    return ModelPool(listed, slots[0]._metrics, Capacity(Budget(), lambda: listed), slots[0]._clock,
                     model_wait_s=0, resolve=model_capabilities, default_models=defaults)  # fmt: skip


def test_a_named_model_is_used_as_named() -> None:
    pool = _pool(fake_slot(FakeBackend(), "a", tasks=TEXT), fake_slot(FakeBackend(), "b", tasks=TEXT))
    assert pool.model_for("b", Task.COMPLETION) == "b"


def test_the_only_model_that_does_the_task_is_the_default() -> None:
    pool = _pool(fake_slot(FakeBackend(), "chat"), fake_slot(FakeBackend(), "text", tasks=TEXT))
    assert pool.model_for(None, Task.SCORING) == "text"


def test_several_candidates_without_a_default_is_a_400_naming_them() -> None:
    pool = _pool(fake_slot(FakeBackend(), "a", tasks=TEXT), fake_slot(FakeBackend(), "b", tasks=TEXT))
    with pytest.raises(InvalidRequest) as caught:
        pool.model_for(None, Task.COMPLETION)
    assert caught.value.param == "model" and "candidates: a, b" in caught.value.message
    assert "defaults.models.completion" in caught.value.message
    with pytest.raises(InvalidRequest, match="no served model does scoring"):
        _pool(fake_slot(FakeBackend(), "chat")).model_for(None, Task.SCORING)


def test_a_configured_default_chooses_among_several() -> None:
    a, b = fake_slot(FakeBackend(), "a", tasks=TEXT), fake_slot(FakeBackend(), "b", tasks=TEXT)
    assert _pool(a, b, defaults={Task.COMPLETION: "b"}).model_for(None, Task.COMPLETION) == "b"


def test_a_default_that_cannot_do_its_task_is_refused_when_the_pool_is_built() -> None:
    with pytest.raises(UnsupportedTask, match="does not do scoring"):
        _pool(fake_slot(FakeBackend(), "chat"), defaults={Task.SCORING: "chat"})


@pytest.mark.parametrize(
    ("path", "body"),
    [("/generate", {"prompts": ["Hi"], "temperature": 0.7}),
     ("/loglikelihood", {"prompts": ["Hi"], "continuations": [" there"]})],
)  # fmt: skip
async def test_the_routes_answer_a_body_without_model_with_the_candidates(path: str, body: dict[str, object]) -> None:
    pool = _pool(fake_slot(FakeBackend(), "a", tasks=TEXT), fake_slot(FakeBackend(), "b", tasks=TEXT))
    app = create_app(load_config(environ={}, cli={"starter_models": False}), pool)
    async with LifespanManager(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            reply = await client.post(path, json=body)
            empty = await client.post(path, json={**body, "model": ""})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "model"
    assert "candidates: a, b" in reply.json()["error"]["message"]
    assert empty.status_code == 400  # an empty name is not "no name"


async def test_an_embedding_model_learns_its_dimensions_as_it_loads() -> None:
    """`/v1/models` shows `dimensions` (the simple inference server's field) once loaded:
    probed with the warmup, before any request; a model without warmup learns it from its
    first embedding."""
    warmed = fake_slot(FakeBackend(), "warm", tasks=frozenset({Task.EMBEDDING}), warmup=True)
    cold = fake_slot(FakeBackend(), "cold", tasks=frozenset({Task.EMBEDDING}))
    pool = _pool(warmed, cold)
    await warmed.ensure_ready(None)
    await cold.ensure_ready(None)
    assert pool.status("warm").dimensions == FakeBackend.dimensions and pool.status("cold").dimensions is None
    await pool.embed("cold", EmbeddingRequest(("x",)))
    assert pool.status("cold").dimensions == FakeBackend.dimensions
    await pool.close()
