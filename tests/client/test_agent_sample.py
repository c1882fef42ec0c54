"""The agent sample's SDK contract (xr_ai_models): its models.yaml loads as written, its
presets exist and carry what its own presets say, its hosted-NIM entry calls the hosted
side with the saved key, and Llama-Nemotron's "detailed thinking on/off" switch is sent.

The YAML bodies below are copied verbatim from the sample's documentation:
- MODELS_YAML: NVIDIA xr-ai docs/ai-services.md, "Calling these from a worker" (also in
  agent-sdk/xr-ai-models/README.md, "Quickstart");
- NIM_ENTRY: docs/ai-services.md, "Hosting models on NVIDIA NIM";
- EXPLICIT_SPEC: agent-sdk docs, "Explicit (no-preset) specification";
- NIM_LLM: the sample's tests/test_models_config.py (test_health_check_defaults_true_and_parses_false).
The hosted side is a stand-in (tests/client/helpers.py ScriptedServer) that checks the
bearer key and records every body."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import yaml

from modelpool.client import (
    AuthenticationError,
    ChatMessage,
    ConfigError,
    load_models_config,
    make_llm,
    make_stt,
    make_tts,
    make_vlm,
)
from modelpool.client.presets import PRESETS, Role, Thinking
from tests.client.conftest import KEY, KEY_ENV
from tests.client.helpers import ScriptedServer, tiny_png, words
from tests.processes import Server

MODELS_YAML = """\
agent_llm:
  kind:     preset:nemotron3_nano
  base_url: http://localhost:8107

vlm:
  kind:     preset:cosmos_vlm
  base_url: http://localhost:8100

stt:
  kind:     preset:parakeet_stt
  base_url: http://localhost:8103

tts:
  kind:     preset:piper_tts
  base_url: http://localhost:8105
"""
NIM_ENTRY = """\
vlm:
  kind:        openai_compat
  category:    vlm
  base_url:    https://integrate.api.nvidia.com   # client appends /v1/...
  model_name:  nvidia/cosmos-reason1-7b           # confirm slug at build.nvidia.com
  api_key_env: NGC_API_KEY                         # → Authorization: Bearer
  health_check: false                              # hosted NIM has no /health
  capabilities: { vision: true, streaming: true }
"""
EXPLICIT_SPEC = """\
agent_llm:
  kind:       openai_compat
  category:   llm
  base_url:   http://localhost:8107
  model_name: llm
  capabilities: { tool_calls: true, reasoning: true }
  reasoning_field: reasoning
  default_extras:
    chat_template_kwargs: { enable_thinking: false }
  timeout: 60.0
"""
NIM_LLM = """\
nim_llm:
  kind:        openai_compat
  category:    llm
  base_url:    https://integrate.api.nvidia.com
  model_name:  meta/llama-3.1-8b-instruct
  api_key_env: NGC_API_KEY
  health_check: false
"""
NGC_KEY = "nvapi-stand-in-0f3c-never-print-me"
SAMPLE_PRESETS = ["cosmos_vlm", "cosmos3_nano_reasoner", "llama_nemotron", "nemotron3_nano", "nemotron_omni",
                  "nemotron_embedding", "parakeet_stt", "piper_tts", "magpie_tts"]  # fmt: skip


def _write(folder: Path, text: str) -> Path:
    path = folder / "models.yaml"
    path.write_text(text)
    return path


def _answer(content: str, **message: object) -> dict[str, object]:
    return {"id": "c", "object": "chat.completion", "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content, **message},
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}  # fmt: skip


def test_the_documented_models_yaml_loads_with_the_samples_served_names(tmp_path: Path) -> None:
    config = load_models_config(_write(tmp_path, MODELS_YAML), environ={})
    llm, vlm, stt, tts = (config.endpoint(role) for role in ("agent_llm", "vlm", "stt", "tts"))
    assert (llm.model_name, llm.base_url, llm.reasoning_fields[0]) == ("llm", "http://localhost:8107", "reasoning")
    assert llm.capabilities.tool_calls and llm.capabilities.reasoning
    assert llm.extra_body == {"chat_template_kwargs": {"enable_thinking": False}}
    assert (vlm.model_name, vlm.kind, vlm.capabilities.vision, vlm.capabilities.video) == ("vlm", Role.VLM, True, True)
    assert vlm.extra_body == {"chat_template_kwargs": {"enable_thinking": False}}
    assert (stt.model_name, stt.kind, stt.timeout_s, stt.capabilities.verbose_json) == ("stt", Role.STT, 30.0, False)
    assert (tts.model_name, tts.kind) == ("tts", Role.TTS)


def test_every_preset_of_the_samples_table_exists_with_its_port() -> None:
    missing = [name for name in SAMPLE_PRESETS if name not in PRESETS]
    assert not missing
    ports = {name: PRESETS[name].default_port for name in SAMPLE_PRESETS}
    assert ports["nemotron3_nano"] == 8107 and ports["llama_nemotron"] == 8106 and ports["cosmos_vlm"] == 8100
    assert ports["parakeet_stt"] == 8103 and ports["piper_tts"] == 8105 and ports["magpie_tts"] == 8104
    assert PRESETS["llama_nemotron"].thinking is Thinking.SYSTEM_PROMPT
    assert PRESETS["nemotron_omni"].reasoning_fields[0] == "reasoning_content"


def test_the_nim_entry_and_the_explicit_spec_load_as_written(tmp_path: Path) -> None:
    nim = load_models_config(_write(tmp_path, NIM_ENTRY), environ={"NGC_API_KEY": NGC_KEY}).endpoint("vlm")
    assert (nim.kind, nim.health_check, nim.model_name, nim.api_key) == (Role.VLM, False, "nvidia/cosmos-reason1-7b",
                                                                         NGC_KEY)  # fmt: skip
    assert nim.capabilities.vision and nim.capabilities.streaming
    assert NGC_KEY not in repr(nim)
    explicit = load_models_config(_write(tmp_path, EXPLICIT_SPEC), environ={}).endpoint("agent_llm")
    assert (explicit.kind, explicit.timeout_s, explicit.reasoning_fields[0]) == (Role.LLM, 60.0, "reasoning")
    assert explicit.capabilities.tool_calls and explicit.capabilities.reasoning
    assert explicit.extra_body == {"chat_template_kwargs": {"enable_thinking": False}}
    hosted_llm = load_models_config(_write(tmp_path, NIM_LLM), environ={"NGC_API_KEY": NGC_KEY}).endpoint("nim_llm")
    assert (hosted_llm.health_check, hosted_llm.api_key_env) == (False, "NGC_API_KEY")


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ({"kind": "openai_compat", "categroy": "vlm", "model_name": "m"}, "categroy"),
        ({"kind": "openai_compat", "category": "video", "model_name": "m"}, "category"),
        ({"kind": "preset:cosmos_vlm", "category": "stt"}, "does not fit preset:cosmos_vlm"),
        (
            {"kind": "openai_compat", "category": "llm", "model_name": "m", "capabilities": {"telepathy": True}},
            "telepathy",
        ),
        ({"kind": "preset:nemotron3_nano", "timeout": 0}, "timeout"),
        ({"kind": "preset:nemotron3_nano", "reasoning_field": "a", "reasoning_fields": ["b"]}, "not both"),
    ],
)
def test_unknown_or_conflicting_fields_are_refused(tmp_path: Path, entry: dict[str, object], problem: str) -> None:
    text = yaml.safe_dump({"role": {**entry, "base_url": "http://localhost:8107"}})
    with pytest.raises(ConfigError, match=problem):
        load_models_config(_write(tmp_path, text), environ={})


def test_category_decides_which_make_fits(tmp_path: Path) -> None:
    config = load_models_config(_write(tmp_path, MODELS_YAML + textwrap.dedent(NIM_LLM)), environ={"NGC_API_KEY": "k"})
    with pytest.raises(ConfigError, match="use make_vlm"):
        make_llm(config, "vlm")
    with pytest.raises(ConfigError, match="cannot be a VLM"):  # an llm reads no images
        make_vlm(config, "nim_llm")
    with pytest.raises(ConfigError, match="use make_stt"):
        make_tts(config, "stt")


async def test_the_hosted_nim_vlm_gets_the_key_and_is_never_probed(tmp_path: Path) -> None:
    with ScriptedServer(required_key=NGC_KEY) as hosted:
        text = NIM_ENTRY.replace("https://integrate.api.nvidia.com", hosted.url)
        config = load_models_config(_write(tmp_path, text), environ={"NGC_API_KEY": NGC_KEY})
        hosted.answer_json(_answer("A red square."))
        async with make_vlm(config, "vlm") as vlm:
            await vlm.wait_ready(timeout_s=5)
            result = await vlm.chat([ChatMessage.user("What is this?", images=[tiny_png()])], max_tokens=8)
        assert result.content == "A red square."
        assert hosted.gets == []  # health_check: false — a hosted endpoint is never probed
        assert hosted.authorizations == [f"Bearer {NGC_KEY}"]
        path, body = hosted.requests[0]
        assert path == "/v1/chat/completions" and body["model"] == "nvidia/cosmos-reason1-7b"
        parts = body["messages"][0]["content"]
        assert [p["type"] for p in parts] == ["text", "image_url"]
        assert parts[1]["image_url"]["url"].startswith("data:image/png;base64,")

        wrong = load_models_config(_write(tmp_path, text), environ={"NGC_API_KEY": "nvapi-wrong"})
        async with make_vlm(wrong, "vlm") as vlm:
            with pytest.raises(AuthenticationError) as refused:
                await vlm.chat([ChatMessage.user("hi")], max_tokens=8)
        assert "nvapi-wrong" not in str(refused.value) and NGC_KEY not in str(refused.value)


async def test_nemotron3_nano_sends_thinking_off_unless_asked_and_reads_reasoning(tmp_path: Path) -> None:
    with ScriptedServer() as server:
        config = load_models_config(_write(tmp_path, MODELS_YAML.replace("http://localhost:8107", server.url)),
                                    environ={})  # fmt: skip
        server.answer_json(_answer("4"))
        server.answer_json(_answer("4", reasoning="2+2 is 4."))
        async with make_llm(config, "agent_llm") as llm:
            await llm.chat([ChatMessage.user("2+2?")], max_tokens=8)
            thought = await llm.chat([ChatMessage.user("2+2?")], max_tokens=8, enable_thinking=True)
        assert [b["chat_template_kwargs"] for b in server.bodies] == [{"enable_thinking": False},
                                                                     {"enable_thinking": True}]  # fmt: skip
        assert all(b["model"] == "llm" for b in server.bodies)
        assert thought.reasoning == "2+2 is 4."


async def test_llama_nemotron_switches_thinking_with_a_system_message(tmp_path: Path) -> None:
    with ScriptedServer() as server:
        text = f"llm:\n  kind: preset:llama_nemotron\n  base_url: {server.url}\n"
        config = load_models_config(_write(tmp_path, text), environ={})
        for _ in range(4):
            server.answer_json(_answer("ok"))
        async with make_llm(config, "llm") as llm:
            await llm.chat([ChatMessage.user("hi")], max_tokens=4, enable_thinking=True)
            await llm.chat([ChatMessage.system("Be brief."), ChatMessage.user("hi")], max_tokens=4,
                           enable_thinking=False)  # fmt: skip
            await llm.chat([ChatMessage.system("detailed thinking on\nBe brief."), ChatMessage.user("hi")],
                           max_tokens=4, enable_thinking=False)  # fmt: skip
            await llm.chat([ChatMessage.system("Be brief."), ChatMessage.user("hi")], max_tokens=4)
        sent = [b["messages"] for b in server.bodies]
        assert sent[0] == [{"role": "system", "content": "detailed thinking on"}, {"role": "user", "content": "hi"}]
        assert sent[1][0] == {"role": "system", "content": "detailed thinking off\nBe brief."}
        assert sent[2][0] == {"role": "system", "content": "detailed thinking off\nBe brief."}  # replaced, not doubled
        assert sent[3][0] == {"role": "system", "content": "Be brief."}  # not asked: the model's own default
        assert all("chat_template_kwargs" not in b for b in server.bodies)


@pytest.mark.e2e
async def test_the_samples_presets_on_a_modelpool_stand_in(pool_server: Server, tmp_path: Path) -> None:
    """The documented models.yaml, pointed at one modelpool whose starter models carry the
    sample's served names as aliases (tests/client/conftest.py): whisper stands in for
    parakeet, piper for the sample's piper server, SmolLM2 for Nemotron. Only the URLs and
    the key variable (modelpool here demands one) differ from the documented file."""
    text = MODELS_YAML
    for port in (8107, 8103, 8105):
        text = text.replace(f"http://localhost:{port}", f"{pool_server.url}\n  api_key_env: {KEY_ENV}")
    config = load_models_config(_write(tmp_path, text), environ={KEY_ENV: KEY})
    async with make_tts(config, "tts") as tts, make_stt(config, "stt") as stt, make_llm(config, "agent_llm") as llm:
        await tts.wait_ready(60)
        speech = await tts.speak("The quick brown fox jumps over the lazy dog.")
        heard = await stt.transcribe(speech.audio)
        answer = await llm.chat([ChatMessage.user("Say hello.")], max_tokens=4, extra_body={"min_tokens": 1})
    assert speech.audio[:4] == b"RIFF"
    assert words(heard.text) == words("The quick brown fox jumps over the lazy dog.")
    assert heard.language is None and heard.segments == []  # plain `json`, as the parakeet preset asks
    assert answer.content


# The sample's newer profile shape, verbatim from agent-sdk/xr-ai-models/README.md
# ("Quickstart" models.local.json, "Profile contract", "Remote / hosted-NIM endpoints").
LOCAL_JSON = """{
  "models": {
    "agent_llm": {
      "category": "llm",
      "adapter": {"preset": "nemotron_omni"},
      "endpoint": {"base_url": "http://localhost:8108", "readiness": "health"},
      "deployment": {"ownership": "reused", "service": "omni"}
    }
  }
}"""
CONTRACT_JSON = """{
  "models": {
    "agent_llm": {
      "category": "llm",
      "adapter": {
        "kind": "openai_compat",
        "model_name": "llm",
        "capabilities": {"tool_calls": true, "reasoning": true},
        "reasoning_field": "reasoning"
      },
      "endpoint": {
        "base_url": "http://localhost:8107",
        "timeout": 60.0,
        "readiness": "health"
      },
      "deployment": {"ownership": "reused", "service": "agent-llm"}
    }
  }
}"""
HOSTED_JSON = """{
  "models": {
    "vlm": {
      "category": "vlm",
      "adapter": {
        "kind": "openai_compat",
        "model_name": "nvidia/cosmos3-nano-reasoner"
      },
      "endpoint": {
        "base_url": "https://integrate.api.nvidia.com",
        "api_key_env": "NGC_API_KEY",
        "readiness": "none"
      },
      "deployment": {"ownership": "external"}
    }
  }
}"""


def test_the_samples_nested_json_profiles_load(tmp_path: Path) -> None:
    local = load_models_config(_write(tmp_path, LOCAL_JSON), environ={}).endpoint("agent_llm")
    assert (local.preset.name, local.model_name, local.health_check) == ("nemotron_omni", "llm", True)
    assert local.reasoning_fields[0] == "reasoning_content" and local.capabilities.vision
    contract = load_models_config(_write(tmp_path, CONTRACT_JSON), environ={}).endpoint("agent_llm")
    assert (contract.kind, contract.timeout_s, contract.reasoning_fields[0]) == (Role.LLM, 60.0, "reasoning")
    hosted = load_models_config(_write(tmp_path, HOSTED_JSON), environ={"NGC_API_KEY": NGC_KEY}).endpoint("vlm")
    assert (hosted.kind, hosted.health_check, hosted.api_key) == (Role.VLM, False, NGC_KEY)


@pytest.mark.parametrize(
    ("entry", "problem"),
    [  # the refusals the sample's own loader tests for (tests/test_models_config.py)
        ({"category": "llm", "adapter": [], "endpoint": {"base_url": "http://localhost"}}, "adapter must be a mapping"),
        ({"category": "llm", "adapter": {"kind": "openai_compat", "model_name": "llm"},
          "endpoint": {"base_url": "http://localhost", "readiness": "socket"}}, "unsupported readiness"),
        ({"category": "stt", "adapter": {"kind": "openai_compat"}, "endpoint": {"base_url": "http://localhost"},
          "deployment": {"ownership": "managed"}}, "require a service"),
        ({"category": "stt", "adapter": {"kind": "openai_compat"}, "endpoint": {"base_url": "http://localhost"},
          "deployment": {"ownership": "borrowed"}}, "unsupported deployment ownership"),
        ({"category": "vlm", "api_key_env": "WRONG_LOCATION", "adapter": {"kind": "openai_compat", "model_name": "m"},
          "endpoint": {"base_url": "https://example.test", "readiness": "none"}}, "must go in adapter, endpoint"),
        ({"category": "llm", "adapter": {"preset": "nemotron3_nano", "colour": "red"},
          "endpoint": {"base_url": "http://localhost"}}, "unknown adapter field"),
    ],
)  # fmt: skip
def test_a_wrong_nested_profile_is_refused(tmp_path: Path, entry: dict[str, object], problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        load_models_config(_write(tmp_path, yaml.safe_dump({"models": {"role": entry}})), environ={})
