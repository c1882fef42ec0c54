"""The README's and the quick start's examples, run as a reader would run them: each
```bash block that starts with `curl` goes to the real curl binary against a live server
with the starter models (only the port changed), and must get a 200 with the JSON shape
its route promises; the README's Python blocks run as scripts against the same server."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI

from tests.live_server import live_server

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTED_URL = "http://127.0.0.1:8000"
PAGES_WITH_CURL = [ROOT / "README.md", ROOT / "docs" / "quickstart.md"]


def fenced_blocks(text: str, language: str) -> list[str]:
    return [m.group(1) for m in re.finditer(rf"^```{language}\n(.*?)^```$", text, re.S | re.M)]


def curl_blocks(page: Path) -> list[str]:
    return [block for block in fenced_blocks(page.read_text(), "bash") if block.startswith("curl ")]


def _models(body: Any) -> None:
    assert body["object"] == "list"
    assert {"smollm2-135m-instruct", "all-minilm-l6-v2"} <= {model["id"] for model in body["data"]}


def _chat(body: Any) -> None:
    assert body["object"] == "chat.completion"
    message = body["choices"][0]["message"]
    assert message["role"] == "assistant" and message["content"].strip()
    assert body["usage"]["completion_tokens"] >= 1


def _completion(body: Any) -> None:
    assert body["object"] == "text_completion" and body["choices"][0]["text"].strip()


def _embeddings(body: Any) -> None:
    assert [item["index"] for item in body["data"]] == [0, 1]
    assert all(len(item["embedding"]) == 384 for item in body["data"])


def _rerank(body: Any) -> None:
    scores = [result["relevance_score"] for result in body["results"]]
    assert sorted(scores, reverse=True) == scores and len(scores) == 2
    assert body["results"][0]["document"]["text"] == "a cat"  # a pet: the cat before the car


def _admin_models(body: Any) -> None:
    states = {model["id"]: model["state"] for model in body["data"]}
    assert states["smollm2-135m-instruct"] == "ready"


SHAPES: dict[str, Callable[[Any], None]] = {
    "/v1/models": _models,
    "/v1/chat/completions": _chat,
    "/v1/completions": _completion,
    "/v1/embeddings": _embeddings,
    "/v1/rerank": _rerank,
    "/v1/admin/models": _admin_models,
}


@pytest.fixture(scope="module")
async def server_url(app: FastAPI) -> AsyncIterator[str]:
    """The session's starter app (models loaded) on a real socket."""
    async with live_server(app, lifespan=False) as url:
        yield url


async def run(argv: list[str], timeout_s: float = 120) -> tuple[int, str, str]:
    """A subprocess that does not block the event loop the server runs in."""
    process = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=os.environ.copy()
    )
    stdout, stderr = await asyncio.wait_for(process.communicate(), timeout_s)
    assert process.returncode is not None
    return process.returncode, stdout.decode(), stderr.decode()


def test_the_pages_have_curl_examples() -> None:
    assert len(curl_blocks(ROOT / "README.md")) >= 3
    assert len(curl_blocks(ROOT / "docs" / "quickstart.md")) >= 5


EXAMPLES = [
    pytest.param(block, id=f"{page.name}:{i}") for page in PAGES_WITH_CURL for i, block in enumerate(curl_blocks(page))
]


@pytest.mark.parametrize("block", EXAMPLES)
async def test_curl_example(block: str, server_url: str) -> None:
    assert shutil.which("curl"), "the curl binary runs these examples"
    assert DOCUMENTED_URL in block, "examples use the address `make serve` serves on"
    route = re.search(re.escape(DOCUMENTED_URL) + r"(/[\w/]+)", block)
    assert route is not None and route.group(1) in SHAPES, f"no shape check for {block!r}: add one to SHAPES"
    command = block.replace(DOCUMENTED_URL, server_url).replace("curl ", "curl -sS -w '\\n%{http_code}' ", 1)
    code, stdout, stderr = await run(["bash", "-c", command])
    assert code == 0, stderr
    body, status = stdout.rsplit("\n", 1)
    assert status == "200", body
    SHAPES[route.group(1)](json.loads(body))


@pytest.mark.parametrize("index", range(len(fenced_blocks((ROOT / "README.md").read_text(), "python"))))
async def test_readme_python_example(index: int, server_url: str) -> None:
    """Both SDKs as the README shows them (the openai client and modelpool's own)."""
    script = fenced_blocks((ROOT / "README.md").read_text(), "python")[index].replace(DOCUMENTED_URL, server_url)
    code, stdout, stderr = await run([sys.executable, "-c", script])
    assert code == 0, stderr
    assert stdout.strip(), "each example prints what it got"
