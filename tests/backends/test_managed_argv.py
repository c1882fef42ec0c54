"""The command lines of the managed engine processes (`vllm serve`, llama-server and
llama_cpp.server): every option lands on the right flag with the right value, and bad
options are refused by pydantic before any process is started. No process runs here."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from modelpool.backends.context import BackendContext
from modelpool.backends.managed.llama_server import LlamaServerBackend, LlamaServerOptions
from modelpool.backends.managed.vllm_serve import VllmOptions, VllmServeBackend
from modelpool.backends.registry import model_capabilities
from modelpool.config.schema import ModelConfig
from modelpool.tasks import Task

WEIGHTS = Path("/models/smollm2")
GGUF = Path("/models/smollm2.Q4_1.gguf")
LLAMA_SERVER = "/opt/llama.cpp/bin/llama-server"
VLLM_MODULE = "vllm.entrypoints.openai.api_server"


def vllm(options: dict[str, Any] | None = None, model_id: str = "smol", **config: Any) -> VllmServeBackend:
    model = ModelConfig(id=model_id, backend="vllm_serve", **{"source": str(WEIGHTS), **config})
    return VllmServeBackend(model, VllmOptions.model_validate(options or {}), BackendContext())


def llama(options: dict[str, Any] | None = None, model_id: str = "smol", **config: Any) -> LlamaServerBackend:
    model = ModelConfig(id=model_id, backend="llama_server", source=str(GGUF), **config)
    return LlamaServerBackend(model, LlamaServerOptions.model_validate(options or {}), BackendContext())


def vllm_argv(**options: Any) -> list[str]:
    return vllm(options).command(WEIGHTS)


def native_argv(**options: Any) -> list[str]:
    return llama({"binary": LLAMA_SERVER, **options}).command(GGUF)


def python_argv(**options: Any) -> list[str]:
    return llama(options).command(GGUF)


def value_of(argv: list[str], flag: str) -> str:
    """The value after `flag`, which must occur exactly once."""
    assert argv.count(flag) == 1, f"{flag} occurs {argv.count(flag)} times in {argv}"
    return argv[argv.index(flag) + 1]


def contains(argv: list[str], part: list[str]) -> bool:
    """Whether `part` occurs in `argv` as consecutive items."""
    return any(argv[i : i + len(part)] == part for i in range(len(argv) - len(part) + 1))


# ----- vLLM ------------------------------------------------------------------------------

VLLM_DEFAULT_TAIL = [
    "--host", "127.0.0.1",
    "--port", "{port}",
    "--served-model-name", "smol",
    "--dtype", "auto",
    "--tensor-parallel-size", "1",
]  # fmt: skip


def test_vllm_default_command_runs_the_api_server_module_of_modelpools_python() -> None:
    head = [sys.executable, "-m", VLLM_MODULE, "--model", str(WEIGHTS)]
    assert vllm_argv() == head + VLLM_DEFAULT_TAIL


def test_vllm_python_option_picks_the_interpreter() -> None:
    argv = vllm_argv(python="/srv/vllm-env/bin/python")
    assert argv == ["/srv/vllm-env/bin/python", "-m", VLLM_MODULE, "--model", str(WEIGHTS), *VLLM_DEFAULT_TAIL]


@pytest.mark.parametrize("python", [None, "/srv/vllm-env/bin/python"])
def test_vllm_executable_runs_vllm_serve_with_the_model_positional(python: str | None) -> None:
    argv = vllm_argv(executable="/srv/vllm-env/bin/vllm", python=python)
    assert argv == ["/srv/vllm-env/bin/vllm", "serve", str(WEIGHTS), *VLLM_DEFAULT_TAIL]


@pytest.mark.parametrize("executable", [None, "/usr/local/bin/vllm"])
def test_vllm_model_option_replaces_the_resolved_weights(executable: str | None) -> None:
    argv = vllm_argv(model="HuggingFaceTB/SmolLM2-135M-Instruct", executable=executable)
    assert "HuggingFaceTB/SmolLM2-135M-Instruct" in argv[:5]
    assert str(WEIGHTS) not in argv


async def test_vllm_model_option_is_what_the_backend_loads(tmp_path: Path) -> None:
    assert await vllm({"model": "/elsewhere/smol"}, source=str(tmp_path)).weights() == Path("/elsewhere/smol")
    assert await vllm(source=str(tmp_path)).weights() == tmp_path  # without it: the source, resolved


def test_vllm_serves_under_the_model_id_on_the_port_template() -> None:
    argv = vllm({"host": "0.0.0.0"}, model_id="team/smol-chat:v2").command(WEIGHTS)
    assert value_of(argv, "--served-model-name") == "team/smol-chat:v2"
    assert value_of(argv, "--port") == "{port}" and argv.count("{port}") == 1
    assert value_of(argv, "--host") == "0.0.0.0"


@pytest.mark.parametrize("dtype", ["auto", "half", "float16", "bfloat16", "float", "float32"])
def test_vllm_dtype(dtype: str) -> None:
    assert value_of(vllm_argv(dtype=dtype), "--dtype") == dtype


@pytest.mark.parametrize(
    ("option", "value", "flag", "expected"),
    [
        ("max_model_len", 2048, "--max-model-len", "2048"),
        ("gpu_memory_utilization", 0.85, "--gpu-memory-utilization", "0.85"),
        ("gpu_memory_utilization", 1, "--gpu-memory-utilization", "1.0"),
        ("kv_cache_memory_bytes", "2GB", "--kv-cache-memory-bytes", "2000000000"),
        ("kv_cache_memory_bytes", "2GiB", "--kv-cache-memory-bytes", "2147483648"),
        ("kv_cache_memory_bytes", 1048576, "--kv-cache-memory-bytes", "1048576"),
        ("tensor_parallel_size", 4, "--tensor-parallel-size", "4"),
        ("max_num_seqs", 32, "--max-num-seqs", "32"),
    ],
)
def test_vllm_number_options(option: str, value: object, flag: str, expected: str) -> None:
    assert value_of(vllm_argv(**{option: value}), flag) == expected


@pytest.mark.parametrize(
    ("option", "value", "flag", "expected"),
    [
        ("limit_mm_per_prompt", {"image": 2, "video": 0}, "--limit-mm-per-prompt", '{"image":2,"video":0}'),
        ("mm_processor_kwargs", {"num_crops": 4, "pan": True}, "--mm-processor-kwargs", '{"num_crops":4,"pan":true}'),
        (
            "speculative_config",
            {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": None},
            "--speculative-config",
            '{"method":"ngram","num_speculative_tokens":5,"prompt_lookup_max":null}',
        ),
    ],
)
def test_vllm_document_options_are_compact_json(option: str, value: object, flag: str, expected: str) -> None:
    assert value_of(vllm_argv(**{option: value}), flag) == expected


@pytest.mark.parametrize("option", ["enforce_eager", "trust_remote_code"])
def test_vllm_switches(option: str) -> None:
    flag = "--" + option.replace("_", "-")
    assert flag in vllm_argv(**{option: True})
    assert flag not in vllm_argv(**{option: False})


def test_vllm_extra_args_come_last_after_everything_else() -> None:
    extra = ["--max-num-batched-tokens", "4096", "--disable-log-requests"]
    argv = vllm_argv(
        max_model_len=1024,
        kv_cache_memory_bytes="1GiB",
        speculative_config={"method": "ngram"},
        enforce_eager=True,
        trust_remote_code=True,
        extra_args=extra,
    )
    assert argv[-len(extra) :] == extra
    assert argv.index("--trust-remote-code") < argv.index("--max-num-batched-tokens")


@pytest.mark.parametrize(
    ("options", "concurrency", "context"),
    [({}, 256, None), ({"max_num_seqs": 8, "max_model_len": 2048}, 8, 2048)],
)
def test_vllm_limits_follow_the_options(options: dict[str, Any], concurrency: int, context: int | None) -> None:
    declared = VllmServeBackend.capabilities_for(VllmOptions.model_validate(options))
    assert (declared.engine_concurrency, declared.context_length) == (concurrency, context)


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
        ({"gpu_memory_utilization": 0}, "gpu_memory_utilization"),
        ({"dtype": "int3"}, "dtype"),
        ({"max_model_len": 8}, "max_model_len"),
        ({"tensor_parallel_size": 0}, "tensor_parallel_size"),
        ({"max_num_seqs": 0}, "max_num_seqs"),
        ({"kv_cache_memory_bytes": "plenty"}, "kv_cache_memory_bytes"),
        ({"limit_mm_per_prompt": {"image": "many"}}, "limit_mm_per_prompt"),
        ({"extra_args": "--enforce-eager"}, "extra_args"),
        ({"port": 70000}, "port"),
        ({"start_timeout_s": 0}, "start_timeout_s"),
        ({"tensor_parallel": 2}, "tensor_parallel"),  # unknown key (a typo of tensor_parallel_size)
    ],
)
def test_vllm_invalid_options_are_rejected(options: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as caught:
        VllmOptions.model_validate(options)
    assert {error["loc"][0] for error in caught.value.errors()} == {field}


# ----- llama-server (native) and llama_cpp.server (python) --------------------------------


def test_native_default_command() -> None:
    assert native_argv() == [
        LLAMA_SERVER, "-m", str(GGUF),
        "--host", "127.0.0.1", "--port", "{port}", "--alias", "smol",
        "-c", "4096", "-ngl", "0", "-np", "1",
        "--jinja",
    ]  # fmt: skip


def test_python_default_command() -> None:
    assert python_argv() == [
        sys.executable, "-m", "llama_cpp.server", "--model", str(GGUF),
        "--host", "127.0.0.1", "--port", "{port}", "--model_alias", "smol",
        "--interrupt_requests", "false",  # modelpool queues; a new request must not cut off the running one
        "--n_ctx", "4096", "--n_gpu_layers", "0",
    ]  # fmt: skip


def test_python_option_picks_the_interpreter_unless_a_binary_is_set() -> None:
    python = "/srv/llama-env/bin/python"
    assert python_argv(python=python)[:3] == [python, "-m", "llama_cpp.server"]
    assert native_argv(python=python)[0] == LLAMA_SERVER


@pytest.mark.parametrize("argv", [native_argv, python_argv], ids=["native", "python"])
def test_llama_serves_under_the_model_id_on_the_port_template(argv: Any) -> None:
    command = argv(host="0.0.0.0")
    alias = "--alias" if argv is native_argv else "--model_alias"
    assert value_of(command, alias) == "smol"
    assert value_of(command, "--port") == "{port}" and command.count("{port}") == 1
    assert value_of(command, "--host") == "0.0.0.0"


@pytest.mark.parametrize(
    ("option", "value", "native", "python"),
    [
        ("context_length", 8192, ["-c", "8192"], ["--n_ctx", "8192"]),
        ("gpu_layers", -1, ["-ngl", "-1"], ["--n_gpu_layers", "-1"]),
        ("gpu_layers", 12, ["-ngl", "12"], ["--n_gpu_layers", "12"]),
        ("mmproj", "/m/proj.gguf", ["--mmproj", "/m/proj.gguf"], ["--clip_model_path", "/m/proj.gguf"]),
        ("flash_attention", True, ["-fa", "on"], ["--flash_attn", "true"]),
        ("threads", 6, ["-t", "6"], ["--n_threads", "6"]),
        ("embedding", True, ["--embeddings"], ["--embedding", "true"]),
    ],
)
def test_llama_options_map_to_each_servers_flags(option: str, value: Any, native: list[str], python: list[str]) -> None:
    native_command, python_command = native_argv(**{option: value}), python_argv(**{option: value})
    assert contains(native_command, native) and native_command.count(native[0]) == 1
    assert contains(python_command, python) and python_command.count(python[0]) == 1
    assert not contains(native_command, python) and not contains(python_command, native)


@pytest.mark.parametrize(
    ("option", "off"),
    [("mmproj", None), ("flash_attention", None), ("threads", None), ("embedding", False)],
)
def test_llama_optional_flags_are_absent_when_off(option: str, off: object) -> None:
    assert native_argv(**{option: off}) == native_argv()
    assert python_argv(**{option: off}) == python_argv()


def test_parallel_goes_to_the_native_server_only() -> None:
    assert value_of(native_argv(parallel=3), "-np") == "3"
    assert python_argv(parallel=3) == python_argv()


def test_each_native_slot_gets_the_whole_context_length() -> None:
    # llama-server splits -c among its -np slots (n_ctx_slot = c / np).
    assert value_of(native_argv(parallel=3, context_length=2048), "-c") == str(3 * 2048)


def test_chat_format_goes_to_the_python_server_only() -> None:
    assert value_of(python_argv(chat_format="chatml"), "--chat_format") == "chatml"
    assert native_argv(chat_format="chatml") == native_argv()


@pytest.mark.parametrize("argv", [native_argv, python_argv], ids=["native", "python"])
def test_llama_extra_args_come_last(argv: Any) -> None:
    extra = ["--seed", "7", "--verbose"]
    command = argv(
        mmproj="/m.gguf", flash_attention=True, threads=2, embedding=True, chat_format="chatml", extra_args=extra
    )
    assert command[-len(extra) :] == extra and command.count("--seed") == 1


@pytest.mark.parametrize(("binary", "path"), [(LLAMA_SERVER, "/health"), (None, "/v1/models")])
def test_llama_health_path(binary: str | None, path: str) -> None:
    assert llama({"binary": binary}).health_path == path


@pytest.mark.parametrize(("binary", "concurrency"), [(LLAMA_SERVER, 4), (None, 1)])
def test_llama_concurrency_is_parallel_for_native_and_one_for_python(binary: str | None, concurrency: int) -> None:
    options = LlamaServerOptions.model_validate({"binary": binary, "parallel": 4, "context_length": 2048})
    declared = LlamaServerBackend.capabilities_for(options)
    assert (declared.engine_concurrency, declared.context_length) == (concurrency, 2048)


@pytest.mark.parametrize(
    ("options", "tasks", "expected"),
    [
        ({}, None, {Task.CHAT, Task.COMPLETION}),
        ({"embedding": True}, None, {Task.EMBEDDING}),
        ({"binary": LLAMA_SERVER, "embedding": True}, None, {Task.EMBEDDING}),
        ({}, ["completion"], {Task.COMPLETION}),  # the model's own `tasks` win
        ({"embedding": True}, ["embedding", "chat"], {Task.EMBEDDING, Task.CHAT}),
    ],
)
def test_llama_default_tasks(options: dict[str, Any], tasks: list[Task] | None, expected: set[Task]) -> None:
    model = ModelConfig(id="smol", backend="llama_server", source=str(GGUF), options=options, tasks=tasks)
    assert model_capabilities(model).tasks == expected


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"context_length": 8}, "context_length"),
        ({"gpu_layers": -2}, "gpu_layers"),
        ({"parallel": 0}, "parallel"),
        ({"threads": 0}, "threads"),
        ({"flash_attention": "sometimes"}, "flash_attention"),
        ({"port": 0}, "port"),
        ({"n_ctx": 4096}, "n_ctx"),  # unknown key (llama_cpp's name, not ours)
    ],
)
def test_llama_invalid_options_are_rejected(options: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as caught:
        LlamaServerOptions.model_validate(options)
    assert {error["loc"][0] for error in caught.value.errors()} == {field}


def test_llama_server_renders_with_jinja_unless_told_not_to() -> None:
    """llama-server's tool calling needs its Jinja renderer; llama_cpp.server has no such flag."""
    assert native_argv().count("--jinja") == 1 and "--jinja" not in native_argv(jinja=False)
    assert "--jinja" not in python_argv()


def test_vllm_tool_call_parser_turns_on_auto_tool_choice() -> None:
    command = vllm_argv(tool_call_parser="hermes")
    assert contains(command, ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"])
    assert "--enable-auto-tool-choice" not in vllm_argv()


def test_a_projector_on_llama_cpp_server_selects_the_mtmd_chat_format() -> None:
    """llama_cpp.server drops images unless its chat format runs libmtmd; a chosen format stays."""
    assert value_of(python_argv(mmproj="/m/proj.gguf"), "--chat_format") == "mtmd"
    assert value_of(python_argv(mmproj="/m/proj.gguf", chat_format="llava-1-5"), "--chat_format") == "llava-1-5"
    assert "--chat_format" not in python_argv()


def test_vllm_adapters_turn_on_lora_with_each_adapter_served_under_its_name(tmp_path: Path) -> None:
    pirate, poet = tmp_path / "pirate", tmp_path / "poet"
    pirate.mkdir()
    poet.mkdir()
    backend = vllm({"max_lora_rank": 8, "extra_args": ["--x"]}, adapters={"pirate": str(pirate), "poet": str(poet)},
                   max_adapters=3)  # fmt: skip
    argv = backend.command(WEIGHTS)
    lora = ["--enable-lora", "--max-loras", "3", "--max-lora-rank", "8",
            "--lora-modules", f"pirate={pirate}", f"poet={poet}", "--x"]  # fmt: skip
    assert argv[-len(lora) :] == lora  # before extra_args, which come last
    assert backend.files(WEIGHTS) == [WEIGHTS, pirate, poet]  # mounted into a container too
    assert "--enable-lora" not in vllm_argv()
    assert model_capabilities(backend.model).as_json()["adapters"]


@pytest.mark.parametrize("rank", [0, 7, 1024])
def test_vllm_max_lora_rank_is_one_of_vllms_sizes(rank: int) -> None:
    with pytest.raises(ValidationError, match="max_lora_rank"):
        VllmOptions.model_validate({"max_lora_rank": rank})


class _RecordingUpstream:
    """Stands in for vLLM's HTTP server: records the bodies it is sent."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    async def post_json(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self.bodies.append(body)
        return {"choices": [{"index": 0, "text": "", "message": {"role": "assistant", "content": ""},
                             "finish_reason": "stop"}]}  # fmt: skip


@pytest.mark.parametrize("adapter", [None, "pirate"])
async def test_vllm_requests_name_the_adapter_as_the_upstream_model(adapter: str | None) -> None:
    from modelpool.inference import ChatMessage, ChatRequest, CompletionRequest

    backend = vllm(adapters={"pirate": "/a"})
    upstream = _RecordingUpstream()
    backend.upstream = upstream  # type: ignore[assignment]
    backend.upstream_model = "smol"
    chat = ChatRequest((ChatMessage("user", "hi"),), streamed=False, adapter=adapter)
    _ = [chunk async for chunk in backend.chat(chat)]
    _ = [chunk async for chunk in backend.complete(CompletionRequest("hi", streamed=False, adapter=adapter))]
    assert [body["model"] for body in upstream.bodies] == [adapter or "smol"] * 2
