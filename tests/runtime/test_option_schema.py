"""The overridable options each model reports, with the schema a load form is built from:
real backends' bounds, Optional fields flattened, `$ref`s resolved, values as configured."""

from __future__ import annotations

from enum import Enum
from typing import Any

import httpx
from asgi_lifespan import LifespanManager
from pydantic import BaseModel, ConfigDict

from modelpool.backends.faster_whisper import FasterWhisperBackend
from modelpool.backends.managed.vllm_serve import VllmServeBackend
from modelpool.backends.piper import PiperBackend
from modelpool.config import load_config
from modelpool.config.schema import ModelConfig
from modelpool.runtime.option_schema import option_schemas, override_options
from modelpool.server.app import create_app


class Precision(str, Enum):
    LOW = "low"
    HIGH = "high"


class RefOptions(BaseModel):
    """Enums become `$defs` entries that fields `$ref`: the flattening must inline them."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    precision: Precision = Precision.LOW
    """How precise."""
    fallback: Precision | None = None
    """Used when the first fails."""
    ratio: float | int = 1
    """A real union stays a union."""


def test_real_backends_bounds_come_from_their_options() -> None:
    whisper = option_schemas(FasterWhisperBackend.Options)
    assert whisper["beam_size"] == {
        "type": "integer", "minimum": 1, "default": 1, "title": "Beam Size",
        "description": "Beam search width (1: greedy, fastest).",
    }  # fmt: skip
    assert whisper["vad_filter"]["type"] == "boolean" and whisper["vad_filter"]["default"] is False
    assert option_schemas(PiperBackend.Options)["max_input_chars"]["minimum"] == 1
    assert option_schemas(PiperBackend.Options)["max_input_chars"]["default"] == 4096


def test_optional_fields_are_flattened_with_their_inner_bounds() -> None:
    compute = option_schemas(FasterWhisperBackend.Options)["compute_type"]
    assert (compute["type"], compute["nullable"], compute["default"]) == ("string", True, None)
    share = option_schemas(VllmServeBackend.Options)["gpu_memory_utilization"]
    assert {key: share[key] for key in ("type", "exclusiveMinimum", "maximum", "nullable")} == {
        "type": "number", "exclusiveMinimum": 0, "maximum": 1, "nullable": True,
    }  # fmt: skip
    assert "anyOf" not in share
    assert option_schemas(VllmServeBackend.Options)["extra_args"]["type"] == "array"


def test_refs_are_resolved_and_real_unions_kept() -> None:
    schemas = option_schemas(RefOptions)
    assert schemas["precision"]["enum"] == ["low", "high"] and schemas["precision"]["default"] == "low"
    assert schemas["precision"]["description"] == "How precise."
    fallback = schemas["fallback"]
    assert (fallback["enum"], fallback["nullable"], fallback["description"]) == (
        ["low", "high"], True, "Used when the first fails.",
    )  # fmt: skip
    assert [choice["type"] for choice in schemas["ratio"]["anyOf"]] == ["number", "integer"]
    assert "nullable" not in schemas["ratio"]


def test_values_are_the_configured_ones_with_defaults_filled_in() -> None:
    model = ModelConfig(id="w", backend="faster_whisper", source="Systran/faster-whisper-base",
                        options={"beam_size": 5})  # fmt: skip
    options = override_options(model, FasterWhisperBackend.overridable)
    assert [option.name for option in options] == ["beam_size", "compute_type", "cpu_threads", "vad_filter"]
    values = {option.name: option.value for option in options}
    assert values == {"beam_size": 5, "compute_type": None, "cpu_threads": 0, "vad_filter": False}


async def test_the_admin_api_reports_each_override_option() -> None:
    models: dict[str, Any] = {"whisper-base": {"preload": False, "options": {"beam_size": 3}},
                              "piper-en-us-joe": {"preload": False}}  # fmt: skip
    config = load_config(None, cli={"enabled_models": list(models), "models": models}, environ={})
    app = create_app(config)
    async with (
        LifespanManager(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as http,
    ):
        listed = {m["id"]: m for m in (await http.get("/v1/admin/models")).json()["data"]}
    whisper = {option["name"]: option for option in listed["whisper-base"]["override_options"]}
    assert whisper["beam_size"]["value"] == 3 and whisper["beam_size"]["schema"]["minimum"] == 1
    assert [o["name"] for o in listed["whisper-base"]["override_options"]] == listed["whisper-base"]["overridable"]
    piper = listed["piper-en-us-joe"]["override_options"]
    assert [(o["name"], o["value"], o["schema"]["minimum"]) for o in piper] == [("max_input_chars", 4096, 1)]


def test_secrets_are_redacted_inside_an_option_too() -> None:
    model = ModelConfig(id="v", backend="vllm_serve", source="Qwen/Qwen2.5-0.5B-Instruct",
                        options={"env": {"HF_TOKEN": "hf_secret", "VLLM_LOGGING_LEVEL": "INFO"}})  # fmt: skip
    (env,) = override_options(model, frozenset({"env"}))
    assert env.value == {"HF_TOKEN": "***", "VLLM_LOGGING_LEVEL": "INFO"}
