"""Shared fixtures. The e2e fixtures serve the REAL starter models (SmolLM2 GGUF through
llama.cpp, all-MiniLM-L6-v2 through sentence-transformers), loaded once per session."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import AsyncIterator, Iterator, Mapping
from pathlib import Path

import httpx
import openai
import pytest
from asgi_lifespan import LifespanManager
from fastapi import FastAPI

from modelpool.config import Config, load_config
from modelpool.server import ratelimit
from modelpool.server.app import create_app
from modelpool.server.auth import KeyRing
from tests.containers.host import ContainerHost, find_container_host
from tests.hub_standin import hub_env, hub_standin  # noqa: F401  # fixtures: the stand-in Hugging Face hub
from tests.processes import USAGE_PATH_ENV

CHAT_MODEL = "smollm2-135m-instruct"
EMBED_MODEL = "all-minilm-l6-v2"
HF_MODEL = "smollm2-135m-instruct-hf"
CT2_MODEL = "smollm2-135m-instruct-ct2"
STT_MODEL = "whisper-tiny.en"
MULTILINGUAL_STT_MODEL = "whisper-base"
TTS_MODEL = "piper-en-us-joe"
KOKORO_MODEL = "kokoro-82m"
STARTER_IDS = {CHAT_MODEL, EMBED_MODEL, HF_MODEL, CT2_MODEL, STT_MODEL, MULTILINGUAL_STT_MODEL, TTS_MODEL, KOKORO_MODEL}
BASE_URL = "http://127.0.0.1"
"""Where the in-process apps are reached: a loopback name, as a local SDK client reaches the
server (a loopback bind refuses other Host names: server/host_guard.py)."""
TEST_HOSTS = {"allowed_hosts": ["modelpool.test"]}
"""The starter apps here also answer to `modelpool.test`, the name tests used before."""


@pytest.fixture(scope="session", autouse=True)
def own_usage_files(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """`usage_store` is on by default with one file under `work_dir`: were every app here to
    use it, budgets and totals would carry from test to test. Each in-process app gets a file
    of its own instead; a `modelpool serve` started through `tests.processes` gets one beside
    its log, and any other child server this session's fallback (never the user's own file).
    Tests of durability set `usage_store.path` themselves."""
    folder = tmp_path_factory.mktemp("usage")
    numbers = itertools.count()

    def fresh_file(config: Config) -> Path:
        return folder / f"app-{next(numbers)}" / "usage.sqlite"

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ratelimit, "default_usage_path", fresh_file)
        patch.setenv(USAGE_PATH_ENV, str(folder / "child-servers" / "usage.sqlite"))
        yield folder


def starter_config(**server: object) -> Config:
    """The starter catalog, as `make serve` runs it, with test-only server settings."""
    cli = {"server": {"max_body_bytes": 1_000_000, **TEST_HOSTS, **server}}
    return load_config(None, cli=cli, environ={})


@contextlib.asynccontextmanager
async def serving(
    cli: Mapping[str, object], keys: KeyRing | None = None
) -> AsyncIterator[tuple[FastAPI, httpx.AsyncClient]]:
    """A fresh in-process app for the starter catalog changed by `cli` (the CLI layer), with
    an httpx client on it. Its models load as their config says (preload or on demand)."""
    server = cli.get("server", {})
    assert isinstance(server, dict)
    config = load_config(None, cli={**cli, "server": {**TEST_HOSTS, **server}}, environ={})
    application = create_app(config, keys=keys)
    async with LifespanManager(application, startup_timeout=60, shutdown_timeout=60):
        transport = httpx.ASGITransport(app=application)
        async with httpx.AsyncClient(transport=transport, base_url=BASE_URL, timeout=120) as client:
            yield application, client


def sdk(client: httpx.AsyncClient, api_key: str = "unused") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{BASE_URL}/v1", api_key=api_key, http_client=client, max_retries=0)  # type: ignore[arg-type]  # the SDK takes a legacy httpx client at runtime; it annotates only httpx2


@pytest.fixture(scope="session")
async def app() -> AsyncIterator[FastAPI]:
    application = create_app(starter_config())
    async with LifespanManager(application, startup_timeout=60, shutdown_timeout=60):
        for slot in application.state.pool.slots():
            if slot.config.preload:  # the transformers model loads on demand (its tests do that)
                await slot.ensure_ready(None)
        yield application


@pytest.fixture(scope="session")
async def http(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url=BASE_URL, timeout=120) as client:
        yield client


@pytest.fixture(scope="session")
async def oai(http: httpx.AsyncClient) -> AsyncIterator[openai.AsyncOpenAI]:
    """The official OpenAI SDK, talking to the in-process app."""
    client = openai.AsyncOpenAI(base_url=f"{BASE_URL}/v1", api_key="unused", http_client=http, max_retries=0)  # type: ignore[arg-type]  # the SDK takes a legacy httpx client at runtime; it annotates only httpx2
    yield client


@pytest.fixture(scope="session")
def container_host() -> ContainerHost:
    """Podman (or Docker) with the local base image (tests/containers/host.py); a skip saying
    what to run where there is none."""
    host = find_container_host()
    if isinstance(host, str):
        pytest.skip(host)
    return host
