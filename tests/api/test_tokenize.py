"""POST /tokenize and /detokenize on a fake tokenizer (one token per character): the shape a
request comes in picks the shape of the answer, `model` may be left out only when one model
has a tokenizer, bad bodies are 400s naming the field, and a backend that declares a
tokenizer without implementing one fails its load. The real tokenizers: tests/e2e/test_tokenize.py."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from asgi_lifespan import LifespanManager

from modelpool.backends.base import contract_problem
from modelpool.backends.textgen.decoding import check_token_ids
from modelpool.capabilities import Capabilities, Locality
from modelpool.config import load_config
from modelpool.config.schema import ModelConfig
from modelpool.inference import ChatRequest, TokenPiece
from modelpool.server.app import create_app
from modelpool.server.auth import KeyRing
from modelpool.tasks import Task
from tests.fakes import EchoBackend

BOS = 1
HI = [{"role": "user", "content": "hi"}]


class CharTokenizerBackend(EchoBackend):
    """Echo chat plus a tokenizer: a character's code point is its token, BOS is 1."""

    capabilities = Capabilities(tasks=frozenset({Task.CHAT}), needs_source=False, tokenizer=True)

    async def encode_text(self, text: str, add_special_tokens: bool) -> list[int]:
        return [BOS] * add_special_tokens + [ord(char) for char in text]

    async def encode_chat(self, request: ChatRequest, add_generation_prompt: bool) -> list[int]:
        text = "".join(f"<{m.role}>{m.content}" for m in request.messages)
        return await self.encode_text(text + "<assistant>" * add_generation_prompt, False)

    async def decode_tokens(self, ids: list[int]) -> str:
        return "".join(chr(t) for t in check_token_ids(ids, 0x110000, "tokens"))

    async def token_pieces(self, ids: list[int]) -> list[TokenPiece] | None:
        return [TokenPiece(t, chr(t).encode(), f"<{t}>") for t in ids]

    async def max_model_len(self) -> int | None:
        return 64


class NoPiecesBackend(CharTokenizerBackend):
    async def token_pieces(self, ids: list[int]) -> list[TokenPiece] | None:
        return None


class UndeclaredPiecesBackend(EchoBackend):
    """Declares a tokenizer and implements none of it."""

    capabilities = Capabilities(tasks=frozenset({Task.CHAT}), needs_source=False, tokenizer=True)


HERE = "tests.api.test_tokenize"
MODELS: dict[str, Any] = {
    "chars": {"backend": f"{HERE}:CharTokenizerBackend", "preload": False, "aliases": ["c"]},
    "nopieces": {"backend": f"{HERE}:NoPiecesBackend", "preload": False},
    "broken": {"backend": f"{HERE}:UndeclaredPiecesBackend", "preload": False},
    "echo": {"backend": "tests.fakes:EchoBackend", "preload": False},
    "far": {"backend": "openai_remote", "options": {"base_url": "http://127.0.0.1:9/v1"}, "preload": False},
}


@contextlib.asynccontextmanager
async def served(models: dict[str, Any], auth: dict[str, Any] | None = None) -> AsyncIterator[httpx.AsyncClient]:
    config = load_config(environ={}, cli={"starter_models": False, "models": models, "auth": auth or {}})
    app = create_app(config, keys=KeyRing.from_config(config.auth, environ={"TOKENIZE_TEST_KEY": "k"}))
    async with LifespanManager(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            yield client


@pytest.fixture(scope="module")
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with served(MODELS) as http:
        yield http


async def post(client: httpx.AsyncClient, path: str, body: dict[str, Any]) -> Any:
    response = await client.post(path, json=body)
    assert response.status_code == 200, response.text
    return response.json()


async def test_vllm_text_shape(client: httpx.AsyncClient) -> None:
    body = {"model": "chars", "prompt": "hé"}
    assert await post(client, "/tokenize", body) == {
        "count": 3, "max_model_len": 64, "tokens": [BOS, 104, 233], "token_strs": None,
    }  # fmt: skip
    plain = await post(client, "/tokenize", {**body, "add_special_tokens": False, "return_token_strs": True})
    assert plain["tokens"] == [104, 233] and plain["token_strs"] == ["<104>", "<233>"]


async def test_vllm_chat_shape(client: httpx.AsyncClient) -> None:
    opened = await post(client, "/tokenize", {"model": "c", "messages": HI})
    closed = await post(client, "/tokenize", {"model": "c", "messages": HI, "add_generation_prompt": False})
    assert opened["tokens"] == [ord(c) for c in "<user>hi<assistant>"] and opened["count"] == len(opened["tokens"])
    assert closed["tokens"] == [ord(c) for c in "<user>hi"]


async def test_llama_server_shape(client: httpx.AsyncClient) -> None:
    assert await post(client, "/tokenize", {"model": "chars", "content": "hi"}) == {"tokens": [104, 105]}
    special = await post(client, "/tokenize", {"model": "chars", "content": "hi", "add_special": True})
    assert special == {"tokens": [BOS, 104, 105]}
    pieces = await post(client, "/tokenize", {"model": "chars", "content": "hé", "with_pieces": True})
    assert pieces == {"tokens": [{"id": 104, "piece": "h"}, {"id": 233, "piece": "é"}]}


async def test_detokenize_answers_in_both_shapes(client: httpx.AsyncClient) -> None:
    answer = await post(client, "/detokenize", {"model": "chars", "tokens": [104, 105]})
    assert answer == {"prompt": "hi", "content": "hi"}


async def test_model_may_be_left_out_only_when_one_model_has_a_tokenizer(client: httpx.AsyncClient) -> None:
    ambiguous = await client.post("/tokenize", json={"content": "hi"})
    assert ambiguous.status_code == 400 and ambiguous.json()["error"]["param"] == "model"
    assert "chars, nopieces, broken" in ambiguous.json()["error"]["message"]
    alone = {"chars": MODELS["chars"], "echo": MODELS["echo"]}
    async with served(alone) as only:
        assert await post(only, "/tokenize", {"content": "hi"}) == {"tokens": [104, 105]}
        assert (await post(only, "/detokenize", {"tokens": [104]}))["content"] == "h"


async def test_capabilities_show_the_tokenizer(client: httpx.AsyncClient) -> None:
    listed = {m["id"]: m["capabilities"] for m in (await client.get("/v1/models")).json()["data"]}
    assert (listed["chars"]["tokenizer"], listed["echo"]["tokenizer"]) == (True, False)


@pytest.mark.parametrize(
    ("path", "body", "param", "says"),
    [
        ("/tokenize", {"model": "chars"}, "prompt", "Missing required parameter"),
        ("/tokenize", {"model": "chars", "prompt": "a", "content": "b"}, None, "exactly one of"),
        ("/tokenize", {"model": "chars", "prompt": 3}, "prompt", "valid string"),
        ("/tokenize", {"model": "chars", "content": "a", "add_special": "yes"}, "add_special", "boolean"),
        ("/tokenize", {"model": "chars", "content": "a", "parse_special": False}, "parse_special", "always"),
        ("/tokenize", {"model": "chars", "content": "a", "n_probs": 3}, "n_probs", "Unrecognized"),
        ("/tokenize", {"model": "chars", "messages": []}, "messages", "at least 1"),
        ("/tokenize", {"model": "chars", "messages": HI, "continue_final_message": True}, "continue_final_message",
         "not supported"),
        ("/tokenize", {"model": "chars", "messages": HI, "add_special_tokens": True}, "add_special_tokens",
         "template places"),
        ("/tokenize", {"model": "chars", "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]}]},
         "messages[0].content", None),
        ("/tokenize", {"model": "echo", "content": "a"}, "model", "has no tokenizer"),
        ("/tokenize", {"model": "far", "prompt": "a", "allow_remote": True}, "model", "remote upstream"),
        ("/tokenize", {"model": "nopieces", "content": "a", "with_pieces": True}, "with_pieces", "pieces"),
        ("/tokenize", {"model": "nopieces", "prompt": "a", "return_token_strs": True}, "return_token_strs", "pieces"),
        ("/detokenize", {"model": "chars", "tokens": [104, -1]}, "tokens", "outside the vocabulary"),
        ("/detokenize", {"model": "chars", "tokens": ["h"]}, "tokens[0]", "valid integer"),
        ("/detokenize", {"model": "chars"}, "tokens", "Missing"),
        ("/detokenize", {"model": "echo", "tokens": [1]}, "model", "has no tokenizer"),
    ],
)  # fmt: skip
async def test_bad_requests_are_400s_naming_the_field(
    client: httpx.AsyncClient, path: str, body: dict[str, Any], param: str | None, says: str | None
) -> None:
    response = await client.post(path, json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert says is None or says in error["message"]


async def test_unknown_model_is_a_404(client: httpx.AsyncClient) -> None:
    response = await client.post("/tokenize", json={"model": "nope", "prompt": "a"})
    assert response.status_code == 404 and response.json()["error"]["code"] == "model_not_found"


async def test_a_declared_tokenizer_must_be_implemented(client: httpx.AsyncClient) -> None:
    response = await client.post("/tokenize", json={"model": "broken", "prompt": "a"})
    assert response.status_code == 503 and response.json()["error"]["code"] == "model_load_error"
    assert "TokenizerBackend" in response.json()["error"]["message"]
    echo = EchoBackend(ModelConfig(id="echo", backend="x"), EchoBackend.Options(), context=None)  # type: ignore[arg-type]
    assert contract_problem(echo, frozenset({Task.CHAT}), Locality.IN_PROCESS) is None
    problem = contract_problem(echo, frozenset({Task.CHAT}), Locality.IN_PROCESS, tokenizer=True)
    assert problem is not None and problem.startswith("a declared tokenizer needs TokenizerBackend")
    assert "decode_tokens" in problem and "encode_text" in problem


async def test_the_routes_need_the_inference_scope() -> None:
    keys = {"keys": [{"name": "app", "key_env": "TOKENIZE_TEST_KEY", "scopes": ["inference"]}]}
    async with served({"chars": MODELS["chars"]}, keys) as http:
        for path in ("/tokenize", "/detokenize"):
            refused = await http.post(path, json={"tokens": [104], "content": "h"})
            assert refused.status_code == 401 and refused.json()["error"]["type"] == "authentication_error"
        allowed = await http.post("/tokenize", json={"content": "h"}, headers={"Authorization": "Bearer k"})
        assert allowed.status_code == 200 and allowed.json() == {"tokens": [104]}
