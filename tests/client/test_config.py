"""models.yaml loading: presets, overrides, keys from the environment, and errors that name
the role and field (fast: no server)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from modelpool.client import (
    ConfigError,
    ModelsConfig,
    Thinking,
    load_models_config,
    make_embedder,
    make_reranker,
    make_vlm,
)
from modelpool.client.config import parse_models_config
from modelpool.client.llm import thinking_fields
from modelpool.client.presets import DEFAULT_HEALTH_PATHS, PRESETS
from modelpool.services.pids import create_time
from modelpool.services.registry import Registry, ServiceRecord

URL = "http://127.0.0.1:8000"


def parse(data: object, **environ: str) -> ModelsConfig:
    return parse_models_config(data, environ=environ, source="models.yaml")


def test_presets_carry_the_served_names_and_quirks() -> None:
    config = parse({
        "chat": {"kind": "preset:smollm2", "base_url": URL},
        "emb": {"kind": "preset:minilm", "base_url": URL},
        "stt": {"kind": "preset:whisper", "base_url": URL},
        "tts": {"kind": "preset:piper", "base_url": URL},
        "qwen": {"kind": "preset:qwen3", "base_url": URL, "model_name": "Qwen/Qwen3-0.6B"},
        "r1": {"kind": "preset:deepseek-r1", "base_url": URL, "model_name": "deepseek-r1:1.5b"},
        "oss": {"kind": "preset:gpt-oss", "base_url": URL, "model_name": "gpt-oss:20b"},
    })  # fmt: skip
    names = {role: e.model_name for role, e in config.endpoints.items()}
    assert names["chat"] == "smollm2-135m-instruct" and names["emb"] == "all-minilm-l6-v2"
    assert (names["stt"], names["tts"]) == ("whisper-tiny.en", "piper-en-us-joe")
    assert config.endpoint("qwen").thinking is Thinking.CHAT_TEMPLATE_KWARGS
    assert config.endpoint("r1").thinking is Thinking.ALWAYS and config.endpoint("chat").thinking is Thinking.NONE
    assert config.endpoint("oss").reasoning_fields[0] == "reasoning"
    assert config.endpoint("r1").reasoning_fields[0] == "reasoning_content"
    assert config.endpoint("chat").health_paths == DEFAULT_HEALTH_PATHS
    assert {"smollm2", "qwen3", "deepseek-r1", "gpt-oss", "minilm", "whisper", "piper"} <= set(PRESETS)


def test_endpoint_fields_override_the_preset() -> None:
    endpoint = parse({
        "eyes": {
            "kind": "preset:smollm2", "base_url": f"{URL}/v1/", "model_name": "smollm2", "timeout_s": 5,
            "capabilities": {"vision": True, "stream_usage": False}, "health_path": "/health",
            "reasoning_fields": ["thoughts"], "thinking": "chat_template_kwargs", "extra_body": {"keep_alive": "5m"},
        }
    }).endpoint("eyes")  # fmt: skip
    assert endpoint.base_url == URL and endpoint.model_name == "smollm2" and endpoint.timeout_s == 5
    caps = endpoint.capabilities
    assert (caps.vision, caps.stream_usage, caps.streaming) == (True, False, True)  # unset fields keep the preset's
    assert endpoint.health_paths == ("/health",) and endpoint.reasoning_fields == ("thoughts",)
    assert endpoint.thinking is Thinking.CHAT_TEMPLATE_KWARGS and endpoint.extra_body == {"keep_alive": "5m"}


def test_the_key_is_read_from_the_named_variable_and_never_shown() -> None:
    config = parse({"llm": {"kind": "preset:smollm2", "base_url": URL, "api_key_env": "MY_KEY"}}, MY_KEY="sk-secret-1")
    endpoint = config.endpoint("llm")
    assert endpoint.api_key == "sk-secret-1"
    assert "sk-secret-1" not in repr(endpoint) and "sk-secret-1" not in repr(config)


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"kind": "preset:llama9", "base_url": URL}, r"role 'r': kind: .*unknown preset 'llama9' \(known presets: "),
        ({"kind": "vllm", "base_url": URL}, "kind must be 'openai_compat' or 'preset:NAME'"),
        ({"kind": "preset:smollm2"}, "give exactly one of base_url or service"),
        ({"kind": "preset:smollm2", "base_url": URL, "service": "s"}, "give exactly one of base_url or service"),
        ({"kind": "openai_compat", "base_url": URL}, "model_name is required with kind openai_compat"),
        ({"kind": "preset:qwen3", "base_url": URL}, "model_name is required with kind preset:qwen3"),
        ({"kind": "preset:smollm2", "base_url": URL, "modle_name": "x"}, "modle_name: Extra inputs are not permitted"),
        ({"kind": "preset:smollm2", "base_url": URL, "api_key": "sk-1"}, "keys never go in the file"),
        ({"kind": "preset:smollm2", "base_url": URL, "capabilities": {"vison": True}}, "capabilities.vison"),
        ({"kind": "preset:smollm2", "base_url": URL, "timeout_s": 0}, "timeout_s"),
    ],
)
def test_bad_endpoints_name_the_role_and_field(spec: dict[str, object], expected: str) -> None:
    with pytest.raises(ConfigError, match=expected) as caught:
        parse({"r": spec})
    assert caught.value.message.startswith("models.yaml: role 'r': ")
    assert "sk-1" not in caught.value.message


def test_an_unset_key_variable_is_named_and_the_role_too() -> None:
    with pytest.raises(ConfigError) as caught:
        parse({"llm": {"kind": "preset:smollm2", "base_url": URL, "api_key_env": "NOT_SET_ANYWHERE"}})
    assert caught.value.message.startswith(
        "models.yaml: role 'llm': environment variable NOT_SET_ANYWHERE (api_key_env) is not set: "
    )
    assert "modelpool credentials set NOT_SET_ANYWHERE" in caught.value.message


def test_unknown_role_lists_the_roles() -> None:
    config = parse({"a": {"kind": "preset:smollm2", "base_url": URL}, "b": {"kind": "preset:minilm", "base_url": URL}})
    with pytest.raises(ConfigError, match=r"unknown role 'c' \(roles: a, b\)"):
        config.endpoint("c")


def test_files_that_cannot_be_read_or_parsed(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read models config"):
        load_models_config(tmp_path / "missing.yaml")
    (tmp_path / "bad.yaml").write_text("llm: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_models_config(tmp_path / "bad.yaml")
    (tmp_path / "empty.yaml").write_text("")
    with pytest.raises(ConfigError, match="expected a mapping of role"):
        load_models_config(tmp_path / "empty.yaml")


def test_make_refuses_a_role_of_another_kind_and_vlm_without_vision() -> None:
    config = parse({"llm": {"kind": "preset:smollm2", "base_url": URL}, "stt": {"kind": "preset:whisper",
                    "base_url": URL}})  # fmt: skip
    with pytest.raises(ConfigError, match="role 'llm' uses preset smollm2, a llm model: use make_llm"):
        make_embedder(config, "llm")
    with pytest.raises(ConfigError, match="capabilities do not include vision"):
        make_vlm(config, "llm")
    with pytest.raises(ConfigError, match="a stt model: use make_stt"):
        make_vlm(config, "stt")
    with pytest.raises(ConfigError, match="a llm model: use make_llm"):
        make_reranker(config, "llm")
    embedders = parse({"emb": {"kind": "preset:minilm", "base_url": URL}, "ce": {"kind": "preset:bge-reranker",
                       "base_url": URL}})  # fmt: skip
    assert make_reranker(embedders, "emb").model == "all-minilm-l6-v2"  # embedding models rerank by cosine
    assert make_reranker(embedders, "ce").model == "bge-reranker-v2-m3"
    with pytest.raises(ConfigError, match="a reranker model: use make_reranker"):
        make_embedder(embedders, "ce")


def test_services_are_looked_up_when_a_client_is_made(tmp_path: Path) -> None:
    config = parse_models_config({"llm": {"kind": "preset:smollm2", "service": "chat"}}, state_dir=tmp_path, environ={})
    with pytest.raises(ConfigError, match="no running service named 'chat'"):
        config.base_url("llm")
    me = os.getpid()
    record = ServiceRecord(id="s:chat@9001", name="chat", kind="modelpool", pid=me, port=9001,
                           url="http://127.0.0.1:9001/v1", started_at=create_time(me) or 0.0)  # fmt: skip
    Registry(tmp_path).put(record)
    assert config.base_url("llm") == "http://127.0.0.1:9001"  # found now, not at load
    by_stack = parse_models_config({"llm": {"kind": "preset:smollm2", "service": "agent/chat"}}, state_dir=tmp_path)
    Registry(tmp_path).put(dataclasses.replace(record, id="agent/chat@9003", url="http://h:9003", stack="agent"))
    assert by_stack.base_url("llm") == "http://h:9003"
    by_id = parse_models_config({"llm": {"kind": "preset:smollm2", "service": "s:chat@9001"}}, state_dir=tmp_path)
    assert by_id.base_url("llm") == "http://127.0.0.1:9001"  # an id is never ambiguous
    with pytest.raises(ConfigError, match="role 'llm': 2 running services are called 'chat'") as caught:
        config.base_url("llm")
    assert "s:chat@9001  chat  http://127.0.0.1:9001/v1  started 20" in caught.value.message
    assert "agent/chat@9003  chat  http://h:9003" in caught.value.message


def test_enable_thinking_goes_on_the_wire_only_where_there_is_a_switch() -> None:
    switch = Thinking.CHAT_TEMPLATE_KWARGS
    assert thinking_fields(switch, False) == {"chat_template_kwargs": {"enable_thinking": False}}
    assert thinking_fields(switch, None) == {}
    assert thinking_fields(Thinking.NONE, True) == {}
    assert thinking_fields(Thinking.ALWAYS, False) == {}  # DeepSeek-R1 cannot stop thinking: not sent
