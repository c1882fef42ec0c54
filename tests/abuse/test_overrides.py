"""Issue 27, item 4: overrides cannot widen what the config allows. An admin's load-time
`extra_args` may add only an engine's performance flags (the row: `--host 0.0.0.0` was
accepted and the engine listened on every interface; `--trust-remote-code --model
other/repo` passed the same way)."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest

from modelpool.backends.managed.engine_flags import LLAMA_CPP_PYTHON, LLAMA_SERVER, VLLM, FlagPolicy
from modelpool.backends.managed.llama_server import LlamaServerOptions
from tests.conftest import sdk, serving
from tests.e2e.conftest import smollm2_gguf

ENGINE, NATIVE, VLLM_MODEL = "engine", "native-engine", "vllm-engine"


def models(state_dir: Path) -> dict[str, object]:
    gguf = str(smollm2_gguf())
    llama = {"backend": "llama_server", "source": gguf, "preload": False,
             "options": {"context_length": 512, "stop_grace_s": 5}}  # fmt: skip
    native = {**llama, "options": {"binary": "/nonexistent/llama-server", "extra_args": ["--no-webui"]}}
    vllm = {"backend": "vllm_serve", "source": gguf, "preload": False, "options": {"model": "org/model"}}
    return {"enabled_models": [ENGINE, NATIVE, VLLM_MODEL], "state_dir": str(state_dir),
            "models": {ENGINE: llama, NATIVE: native, VLLM_MODEL: vllm}}  # fmt: skip


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


async def test_the_admin_load_route_refuses_a_widening_override_before_starting(tmp_path: Path) -> None:
    cases = [
        (ENGINE, {"extra_args": ["--host", "0.0.0.0"]}, "'--host'"),
        (NATIVE, {"extra_args": ["--no-webui", "--host", "0.0.0.0"]}, "'--host'"),
        (NATIVE, {"extra_args": ["--slots"]}, "keeps the configured extra_args"),
        (VLLM_MODEL, {"extra_args": ["--trust-remote-code", "--model", "other/repo"]}, "'--trust-remote-code'"),
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
    async with serving(models(tmp_path)) as (_, client):
        answer = await client.post(f"/v1/admin/models/{ENGINE}/load",
                                   json={"overrides": {"extra_args": ["--n_batch", "64"]}})  # fmt: skip
        assert answer.status_code == 200, answer.text
        reply = await sdk(client).chat.completions.create(
            model=ENGINE, messages=[{"role": "user", "content": "Hi"}], max_tokens=2
        )
        assert reply.choices[0].message.content is not None
        (replica,) = answer.json()["replicas"]
        engine = psutil.Process(replica["pid"])
        argv = engine.cmdline()
        assert argv[argv.index("--n_batch") + 1] == "64" and argv[argv.index("--host") + 1] == "127.0.0.1"
        listening = {c.laddr.ip for c in engine.net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN}
        assert listening == {"127.0.0.1"}
        await client.post(f"/v1/admin/models/{ENGINE}/unload")
