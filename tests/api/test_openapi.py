"""The published OpenAPI tells the truth about statuses, envelopes and content types
(`wire/contract.py` declares, `server/openapi.py` adds the middlewares' statuses). Checked
here on the schema itself; tests/contract/ checks it against a running server."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import schemathesis

from modelpool.config import load_config
from modelpool.server.app import create_app

OPERATIONS = ("get", "post", "put", "patch", "delete")


def published(monkeypatch: pytest.MonkeyPatch, *, keys: bool = False) -> dict[str, Any]:
    cli: dict[str, Any] = {"starter_models": False}
    if keys:
        monkeypatch.setenv("OPENAPI_TEST_KEY", "k" * 32)
        cli["auth"] = {"keys": [{"name": "ops", "key_env": "OPENAPI_TEST_KEY", "scopes": ["inference", "admin"]}]}
    return create_app(load_config(None, cli=cli, environ={})).openapi()


def operations(schema: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(path, method, op) for path, item in schema["paths"].items() for method, op in item.items()
            if method in OPERATIONS]  # fmt: skip


def error_ref(op: dict[str, Any], status: int) -> str:
    return str(op["responses"][str(status)]["content"]["application/json"]["schema"]["$ref"])


def test_the_schema_is_valid_openapi_and_lists_no_422(monkeypatch: pytest.MonkeyPatch) -> None:
    schema = published(monkeypatch)
    schemathesis.openapi.from_dict(schema).validate()  # against the OpenAPI 3.1 meta-schema
    for path, method, op in operations(schema):
        assert "422" not in op["responses"], f"{method} {path}: the server answers validation errors as 400"
        assert {"421", "500"} <= set(op["responses"]), f"{method} {path}"
    assert "HTTPValidationError" not in schema["components"]["schemas"]


def test_each_status_carries_the_envelope_of_its_protocol(monkeypatch: pytest.MonkeyPatch) -> None:
    paths = published(monkeypatch)["paths"]
    chat, messages = paths["/v1/chat/completions"]["post"], paths["/v1/messages"]["post"]
    for status in (400, 404, 408, 413, 429, 503):
        assert error_ref(chat, status) == "#/components/schemas/OpenAIError"
        assert error_ref(messages, status) == "#/components/schemas/AnthropicError"
    assert error_ref(paths["/readyz"]["get"], 503) == "#/components/schemas/NotReady"
    assert "404" in paths["/v1/models/{model_id}"]["get"]["responses"]


def test_content_types_are_the_ones_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    paths = published(monkeypatch)["paths"]

    def success(path: str, method: str = "post") -> set[str]:
        return set(paths[path][method]["responses"]["200"]["content"])

    assert success("/v1/chat/completions") == {"application/json", "text/event-stream"}
    assert success("/v1/messages") == {"application/json", "text/event-stream"}
    assert success("/metrics", "get") == {"text/plain"}
    assert success("/v1/audio/speech") == {"audio/wav", "audio/pcm", "audio/mpeg", "audio/ogg", "audio/flac",
                                           "audio/aac", "text/event-stream"}  # fmt: skip
    assert {"text/plain", "text/vtt", "application/x-subrip"} < success("/v1/audio/transcriptions")


def test_with_keys_the_guarded_routes_declare_security_and_401(monkeypatch: pytest.MonkeyPatch) -> None:
    open_schema = published(monkeypatch)
    assert "securitySchemes" not in open_schema["components"]
    assert all("401" not in op["responses"] for _, _, op in operations(open_schema))
    schema = published(monkeypatch, keys=True)
    assert set(schema["components"]["securitySchemes"]) == {"bearer", "x-api-key"}
    for path, _, op in operations(schema):
        guarded = path not in ("/healthz", "/health", "/readyz", "/metrics", "/metrics/history")
        assert ("security" in op) == guarded == ("401" in op["responses"]) == ("429" in op["responses"]), path


def test_constraints_the_server_enforces_are_stated(monkeypatch: pytest.MonkeyPatch) -> None:
    schema = published(monkeypatch)
    bodies = schema["components"]["schemas"]
    chat = bodies["ChatCompletionBody"]["properties"]
    assert (chat["n"]["minimum"], chat["n"]["maximum"]) == (1, 1)
    assert chat["logit_bias"]["maxProperties"] == 0 and chat["stop"]["maxItems"] == 16
    assert chat["keep_alive"]["anyOf"][0]["maximum"] == 366 * 86400
    assert bodies["CompletionBody"]["properties"]["best_of"]["maximum"] == 1
    assert bodies["EmbeddingsBody"]["properties"]["input"]["items"] == {"minLength": 1, "minItems": 1}
    assert bodies["LoglikelihoodBody"]["properties"]["continuations"]["items"]["minLength"] == 1
    assert bodies["LlamaTokenize"]["properties"]["parse_special"]["const"] is True


def test_rules_no_schema_can_state_are_listed_on_the_400(monkeypatch: pytest.MonkeyPatch) -> None:
    paths = published(monkeypatch)["paths"]
    chat = paths["/v1/chat/completions"]["post"]["responses"]["400"]
    assert any("tool_call_id" in rule for rule in chat["x-unstated-rules"]) and "tool_call_id" in chat["description"]
    assert any("1:N" in rule for rule in paths["/score"]["post"]["responses"]["400"]["x-unstated-rules"])
    assert "x-unstated-rules" not in paths["/v1/models/{model_id}"]["get"]["responses"]["400"]
    # A route lists its own rules only: /score's body has a `model` it must name, /rerank's may not.
    rules = {path: paths[path]["post"]["responses"]["400"]["x-unstated-rules"] for path in
             ("/score", "/v1/rerank", "/generate", "/loglikelihood", "/generate_stream")}  # fmt: skip
    assert not any("left out" in rule for rule in rules["/score"])
    assert any("left out" in rule for rule in rules["/v1/rerank"]) and not any("1:N" in r for r in rules["/v1/rerank"])
    assert any("continuations" in rule for rule in rules["/loglikelihood"])
    assert not any("continuations" in rule for rule in rules["/generate"] + rules["/generate_stream"])


async def test_mcp_is_published_with_json_rpc_errors_and_refuses_other_bodies_in_them() -> None:
    app = create_app(load_config(None, cli={"starter_models": False}, environ={}))
    mcp = app.openapi()["paths"]["/mcp"]["post"]
    for status in (400, 413, 415, 500):
        assert error_ref(mcp, status) == "#/components/schemas/JsonRpcError"
    assert "content" not in mcp["responses"]["202"]  # a notification's answer has no body
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        refused = await client.post("/mcp", content=b"{}", headers={"content-type": "text/plain"})
    assert refused.status_code == 415 and refused.headers["content-type"] == "application/json"
    assert refused.json()["error"]["code"] == -32600 and refused.json()["jsonrpc"] == "2.0"


def test_a_route_that_only_streams_lists_only_sse(monkeypatch: pytest.MonkeyPatch) -> None:
    generate_stream = published(monkeypatch)["paths"]["/generate_stream"]["post"]["responses"]["200"]
    assert set(generate_stream["content"]) == {"text/event-stream"}
