"""Issue 27, item 4: overrides cannot widen what the config allows. An admin's load-time
`extra_args` may add only an engine's performance flags (the row: `--host 0.0.0.0` was
accepted and the engine listened on every interface; `--trust-remote-code --model
other/repo` passed the same way). A request's `chat_template_kwargs` cannot set what the
renderer sets, its `seed` fits 64 bits, and its `keep_alive` is finite and cannot unload a
model sooner than the config says without the admin scope."""

from __future__ import annotations

import inspect
from pathlib import Path

import httpx
import openai
import psutil
import pytest
from openai.types.chat import ChatCompletionMessageParam
from pydantic import BaseModel, ValidationError

from modelpool.backends.llama_cpp.backend import LlamaCppOptions
from modelpool.backends.managed.engine_flags import LLAMA_CPP_PYTHON, LLAMA_SERVER, VLLM, FlagPolicy
from modelpool.backends.managed.llama_server import LlamaServerOptions
from modelpool.backends.managed.vllm_serve import VllmOptions
from modelpool.config import load_config
from modelpool.config.schema import ModelConfig
from modelpool.runtime.option_schema import check_override
from modelpool.server.auth import KeyRing
from modelpool.wire.common import RESERVED_TEMPLATE_KWARGS
from tests.conftest import CHAT_MODEL, HF_MODEL, sdk, serving
from tests.e2e.conftest import smollm2_gguf
from tests.polling import until

ENGINE, NATIVE, VLLM_MODEL, VLLM_IN_PROCESS = "engine", "native-engine", "vllm-engine", "vllm-in-process"
INPROC, DRAFTED = "inproc", "inproc-drafted"


def models(state_dir: Path) -> dict[str, object]:
    gguf = str(smollm2_gguf())
    llama = {"backend": "llama_server", "source": gguf, "preload": False,
             "options": {"context_length": 512, "stop_grace_s": 5}}  # fmt: skip
    native = {**llama, "options": {"binary": "/nonexistent/llama-server", "extra_args": ["--no-webui"]}}
    vllm = {"backend": "vllm_serve", "source": gguf, "preload": False, "options": {"model": "org/model"}}
    inproc = {"backend": "llama_cpp", "source": gguf, "preload": False, "options": {"n_ctx": 512}}
    drafted = {**inproc, "options": {"n_ctx": 512, "speculative": {"draft": gguf}}}
    in_process = {**vllm, "backend": "vllm"}
    return {"enabled_models": [ENGINE, NATIVE, VLLM_MODEL, VLLM_IN_PROCESS, INPROC, DRAFTED],
            "state_dir": str(state_dir),
            "models": {ENGINE: llama, NATIVE: native, VLLM_MODEL: vllm, VLLM_IN_PROCESS: in_process, INPROC: inproc,
                       DRAFTED: drafted}}  # fmt: skip


REFUSED: list[tuple[FlagPolicy, list[str], str]] = [
    # (engine, the override's extra_args, the flag or token the 400 names)
    (LLAMA_CPP_PYTHON, ["--host", "0.0.0.0"], "'--host'"),
    (LLAMA_CPP_PYTHON, ["--host=0.0.0.0"], "'--host'"),
    (LLAMA_CPP_PYTHON, ["--ho", "0.0.0.0"], "'--ho'"),  # argparse would take the prefix
    (LLAMA_CPP_PYTHON, ["--port", "80"], "'--port'"),
    (LLAMA_CPP_PYTHON, ["--model", "/other.gguf"], "'--model'"),
    (LLAMA_CPP_PYTHON, ["--api_key", "k"], "'--api_key'"),
    (LLAMA_CPP_PYTHON, ["--config_file", "/etc/x"], "'--config_file'"),
    (LLAMA_CPP_PYTHON, ["--hf_model_repo_id", "org/repo"], "'--hf_model_repo_id'"),
    (LLAMA_CPP_PYTHON, ["--n_batch", "--host", "0.0.0.0"], "'--host' stands where a value belongs"),
    (LLAMA_SERVER, ["--host", "0.0.0.0"], "'--host'"),
    (LLAMA_SERVER, ["-m", "/other.gguf"], "'-m'"),
    (LLAMA_SERVER, ["-hf", "org/repo"], "'-hf'"),
    (LLAMA_SERVER, ["--api-key", "k"], "'--api-key'"),
    (LLAMA_SERVER, ["--chat-template", "{{x}}"], "'--chat-template'"),
    (LLAMA_SERVER, ["--chat-template-file", "/tmp/t"], "'--chat-template-file'"),
    (LLAMA_SERVER, ["--log-file", "/tmp/x"], "'--log-file'"),
    (LLAMA_SERVER, ["--slot-save-path", "/tmp"], "'--slot-save-path'"),
    (LLAMA_SERVER, ["--lora", "a.gguf"], "'--lora'"),
    (LLAMA_SERVER, ["--path", "/"], "'--path'"),
    (LLAMA_SERVER, ["-c", "99999"], "'-c'"),  # modelpool sets it from context_length
    (LLAMA_SERVER, ["-b", "512", "other.gguf"], "'other.gguf' is neither"),
    (LLAMA_SERVER, ["-b"], "needs a value"),
    (LLAMA_SERVER, ["--mlock=yes"], "takes no value"),
    (LLAMA_SERVER, ["--batch-size=--host"], "takes a value that is not a flag"),
    (VLLM, ["--trust-remote-code", "--model", "other/repo"], "'--trust-remote-code'"),
    (VLLM, ["--trust_remote_code"], "'--trust_remote_code'"),
    (VLLM, ["--host", "0.0.0.0"], "'--host'"),
    (VLLM, ["--api-key", "k"], "'--api-key'"),
    (VLLM, ["--chat-template", "t.jinja"], "'--chat-template'"),
    (VLLM, ["--served-model-name", "x"], "'--served-model-name'"),
    (VLLM, ["--tokenizer", "org/other"], "'--tokenizer'"),
    (VLLM, ["--config", "x.yaml"], "'--config'"),
    (VLLM, ["--tool-parser-plugin", "p.py"], "'--tool-parser-plugin'"),
    (VLLM, ["--download-dir", "/"], "'--download-dir'"),
    (VLLM, ["--max-num-seqs", "999"], "'--max-num-seqs'"),  # modelpool's own option
    (VLLM, ["-tp", "2"], "'-tp'"),
    (VLLM, ["-O3"], "'-O3'"),
]


@pytest.mark.parametrize(
    ("policy", "given", "named"), REFUSED, ids=[f"{p.engine} {' '.join(g)}" for p, g, _ in REFUSED]
)
def test_an_override_may_not_add_a_flag_that_widens(policy: FlagPolicy, given: list[str], named: str) -> None:
    problem = policy.problem([], given)
    assert problem is not None and named in problem, problem


@pytest.mark.parametrize(
    ("policy", "given"),
    [
        (LLAMA_SERVER, ["-b", "512", "-ub", "256", "--mlock", "-ctk", "q8_0", "--batch-size=1024"]),
        (LLAMA_CPP_PYTHON, ["--n_batch", "64", "--use_mlock", "true"]),
        (VLLM, ["--max_num_batched_tokens", "4096", "--enable-prefix-caching", "--seed=-1"]),
    ],
)
def test_performance_flags_may_be_added(policy: FlagPolicy, given: list[str]) -> None:
    assert policy.problem([], given) is None


def test_the_configured_extra_args_stay_in_front() -> None:
    """The config's flags (any flag: it is the operator's word) are kept; dropping one
    (an `--api-key`, a `--no-webui`) could widen too."""
    configured = ["--chat-template-file", "t.jinja"]
    assert LLAMA_SERVER.problem(configured, [*configured, "-b", "512"]) is None
    dropped = LLAMA_SERVER.problem(configured, ["-b", "512"])
    assert dropped is not None and "keeps the configured extra_args" in dropped
    # The config itself may set any flag.
    assert LlamaServerOptions.model_validate({"extra_args": ["--host", "0.0.0.0"]}).extra_args[0] == "--host"


@pytest.mark.parametrize(
    ("options", "field"),
    [(LlamaCppOptions, "n_ctx"), (LlamaServerOptions, "context_length"), (VllmOptions, "max_model_len")],
)
def test_a_context_size_has_an_upper_bound(options: type[BaseModel], field: str) -> None:
    # llama.cpp's n_ctx is a uint32 given context × parallel: unbounded, a huge value wrapped.
    assert options.model_validate({field: 1 << 20})
    with pytest.raises(ValidationError, match=field):
        options.model_validate({field: (1 << 20) + 1})
    largest = {LlamaCppOptions: "parallel", LlamaServerOptions: "parallel"}.get(options)
    if largest is not None:
        assert options.model_validate({field: 1 << 20, largest: 256})
        with pytest.raises(ValidationError, match=largest):
            options.model_validate({largest: 257})
        assert (1 << 20) * 256 < 2**31


def test_an_override_may_tune_the_configured_draft_or_turn_it_off(tmp_path: Path) -> None:
    base = ModelConfig.model_validate({"id": DRAFTED, **models(tmp_path)["models"][DRAFTED]})  # type: ignore[index]
    for options in ({"n_ctx": 512, "speculative": {"draft": str(smollm2_gguf()), "n_max": 4}}, {"n_ctx": 512}):
        check_override(base, base.model_copy(update={"options": options}))


async def test_the_admin_load_route_refuses_a_widening_override_before_starting(tmp_path: Path) -> None:
    cases = [
        (ENGINE, {"extra_args": ["--host", "0.0.0.0"]}, "'--host'"),
        (NATIVE, {"extra_args": ["--no-webui", "--host", "0.0.0.0"]}, "'--host'"),
        (NATIVE, {"extra_args": ["--slots"]}, "keeps the configured extra_args"),
        (VLLM_MODEL, {"extra_args": ["--trust-remote-code", "--model", "other/repo"]}, "'--trust-remote-code'"),
        (VLLM_IN_PROCESS, {"extra_args": ["--model", "other/repo"]}, "'--model'"),
        # The typed knobs (issue 32): out of bounds, missing their runner's flag, or a file only the config names.
        (ENGINE, {"type_k": "q9_0"}, "type_k"),
        (ENGINE, {"flash_attention": "auto"}, "flash_attention: llama_cpp.server takes on or off"),
        (ENGINE, {"type_v": "q8_0"}, "needs flash attention"),
        (NATIVE, {"draft_max_tokens": 8}, "need `draft_model`"),
        (NATIVE, {"draft_p_min": 2}, "draft_p_min"),
        (NATIVE, {"draft_model": "/other.gguf"}, "cannot override draft_model"),
        (NATIVE, {"mmproj": "/other.gguf"}, "cannot override mmproj"),
        (VLLM_MODEL, {"kv_cache_dtype": "fp9"}, "kv_cache_dtype"),
        (VLLM_MODEL, {"speculative": {"model": "other/draft"}}, "not the method or the model"),
        # The in-process engine's draft is a file too: an override can neither add one nor name another.
        (INPROC, {"speculative": {"draft": "/etc/passwd"}}, "speculative: an override may change the numbers"),
        (INPROC, {"speculative": {"draft": "hf:evil/repo:Q4.gguf"}}, "not name the draft"),
        (DRAFTED, {"speculative": {"draft": "/etc/passwd", "n_max": 4}}, "not name the draft"),
    ]
    async with serving(models(tmp_path)) as (app, client):
        for model, overrides, named in cases:
            answer = await client.post(f"/v1/admin/models/{model}/load", json={"overrides": overrides})
            assert answer.status_code == 400, answer.text
            error = answer.json()["error"]
            assert error["param"] == "overrides" and named in error["message"], error
            status = app.state.pool.status(model)
            assert status.state == "unloaded"
            assert status.options.get("extra_args", []) == (["--no-webui"] if model == NATIVE else [])


async def test_an_allowed_override_loads_and_the_engine_stays_on_loopback(tmp_path: Path) -> None:
    # With typed knobs too: q8_0 KV caches (a quantized V cache needs flash attention) reach llama.cpp.
    overrides = {"extra_args": ["--n_batch", "64"], "type_k": "q8_0", "type_v": "q8_0", "flash_attention": "on"}
    async with serving(models(tmp_path)) as (_, client):
        answer = await client.post(f"/v1/admin/models/{ENGINE}/load", json={"overrides": overrides})
        assert answer.status_code == 200, answer.text
        reply = await sdk(client).chat.completions.create(
            model=ENGINE, messages=[{"role": "user", "content": "Hi"}], max_tokens=2
        )
        assert reply.choices[0].message.content is not None
        (replica,) = answer.json()["replicas"]
        engine = psutil.Process(replica["pid"])
        argv = engine.cmdline()
        assert argv[argv.index("--n_batch") + 1] == "64" and argv[argv.index("--host") + 1] == "127.0.0.1"
        assert [argv[argv.index(flag) + 1] for flag in ("--type_k", "--type_v", "--flash_attn")] == ["8", "8", "true"]
        listening = {c.laddr.ip for c in engine.net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN}
        assert listening == {"127.0.0.1"}
        await client.post(f"/v1/admin/models/{ENGINE}/unload")


# ----- a request's own fields: chat_template_kwargs, seed, keep_alive ------------------

HI: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Hi"}]


@pytest.mark.parametrize("key", ["chat_template", "messages", "tools", "add_generation_prompt", "tokenize",
                                 "documents", "continue_final_message", "return_dict", "bos_token"])  # fmt: skip
async def test_template_kwargs_cannot_set_what_the_renderer_sets(http: httpx.AsyncClient, key: str) -> None:
    """On the transformers model `tools`, `tokenize`, `add_generation_prompt` and
    `chat_template` were 500s (apply_chat_template got them twice); on the GGUF one they were
    ignored or changed the render. Refused before any model is asked."""
    for model in (HF_MODEL, CHAT_MODEL):
        body = {"model": model, "messages": HI, "max_tokens": 1, "chat_template_kwargs": {key: "x", "fine": True}}
        answer = await http.post("/v1/chat/completions", json=body)
        assert answer.status_code == 400, answer.text
        error = answer.json()["error"]
        assert error["param"] == "chat_template_kwargs" and key in error["message"], error
    tokenized = await http.post(
        "/tokenize", json={"model": CHAT_MODEL, "messages": HI, "chat_template_kwargs": {key: 1}}
    )
    assert tokenized.status_code == 400 and tokenized.json()["error"]["param"] == "chat_template_kwargs"


async def test_a_template_variable_of_its_own_still_passes(oai: openai.AsyncOpenAI) -> None:
    kwargs = {"chat_template_kwargs": {"enable_thinking": False}}
    reply = await oai.chat.completions.create(model=CHAT_MODEL, messages=HI, max_tokens=2, extra_body=kwargs)
    assert reply.choices[0].message.content is not None


def test_every_parameter_of_apply_chat_template_is_reserved() -> None:
    """A transformers release that adds a parameter would make it a 500 again: caught here."""
    from transformers import PreTrainedTokenizerBase, ProcessorMixin

    for method in (PreTrainedTokenizerBase.apply_chat_template, ProcessorMixin.apply_chat_template):
        named = {n for n, p in inspect.signature(method).parameters.items() if p.kind is not p.VAR_KEYWORD} - {"self"}
        assert named <= RESERVED_TEMPLATE_KWARGS, named - RESERVED_TEMPLATE_KWARGS


async def test_seed_is_a_64_bit_integer(http: httpx.AsyncClient) -> None:
    for seed in (2**63, -(2**63) - 1, 2**64, 10**30):
        for model in (HF_MODEL, CHAT_MODEL):  # torch's manual_seed overflowed: a 500
            body = {"model": model, "messages": HI, "max_tokens": 1, "seed": seed}
            answer = await http.post("/v1/chat/completions", json=body)
            assert answer.status_code == 400 and answer.json()["error"]["param"] == "seed", answer.text
    for seed in (2**63 - 1, -(2**63), 0):
        body = {"model": CHAT_MODEL, "messages": HI, "max_tokens": 1, "seed": seed, "temperature": 1}
        assert (await http.post("/v1/chat/completions", json=body)).status_code == 200, seed


async def test_keep_alive_is_a_finite_duration(http: httpx.AsyncClient) -> None:
    raw = b'{"model": "%s", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, "keep_alive": %s}'
    for value in (b'"inf"', b'"nan"', b'"1e999"', b"1e400", b"1" + b"0" * 400, b'"400d"'):
        answer = await http.post("/v1/chat/completions", content=raw % (CHAT_MODEL.encode(), value),
                                 headers={"content-type": "application/json"})  # fmt: skip
        assert answer.status_code == 400, (value, answer.text)
        assert answer.json()["error"]["param"] == "keep_alive"


KEYED = {
    "starter_models": False,
    "models": {
        "pinned": {"backend": "tests.fakes:EchoBackend", "pinned": True},
        "manual": {"backend": "tests.fakes:EchoBackend", "autoload": False},
        "short": {"backend": "tests.fakes:EchoBackend", "keep_alive": 60},
    },
    "auth": {"keys": [{"name": "app", "key_env": "APP_KEY"},
                      {"name": "ops", "key_env": "OPS_KEY", "scopes": ["inference", "admin"]}]},
}  # fmt: skip
KEYS = {"APP_KEY": "sk-app", "OPS_KEY": "sk-ops"}


async def test_a_request_cannot_unload_its_model_sooner_without_the_admin_scope() -> None:
    config = load_config(None, cli=KEYED, environ={})
    async with serving(KEYED, keys=KeyRing.from_config(config.auth, environ=KEYS)) as (app, client):
        app_key, ops_key = {"Authorization": "Bearer sk-app"}, {"Authorization": "Bearer sk-ops"}
        assert (await client.post("/v1/admin/models/manual/load", headers=ops_key)).status_code == 200

        async def chat(model: str, keep_alive: object, key: dict[str, str]) -> httpx.Response:
            body = {"model": model, "messages": HI, "keep_alive": keep_alive}
            return await client.post("/v1/chat/completions", json=body, headers=key)

        for model, keep_alive in (("pinned", 0), ("manual", "1s"), ("short", 30), ("short", 0)):
            refused = await chat(model, keep_alive, app_key)
            assert refused.status_code == 403, refused.text
            error = refused.json()["error"]
            assert error["type"] == "permission_error" and error["param"] == "keep_alive", error
        for model, keep_alive in (("pinned", -1), ("short", 60), ("short", "2h")):  # as long or longer: anyone
            assert (await chat(model, keep_alive, app_key)).status_code == 200
        assert {app.state.pool.status(m).state for m in ("pinned", "manual", "short")} == {"ready"}
        # The admin may: its keep_alive 0 unloads the pinned model after the answer.
        assert (await chat("pinned", 0, ops_key)).status_code == 200
        await until(lambda: app.state.pool.status("pinned").state == "unloaded", "the pinned model to unload")
