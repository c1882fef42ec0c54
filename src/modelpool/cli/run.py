"""`modelpool run MODEL [PROMPT]`: chat with a model in the terminal, streamed, as `ollama run`.

Which server: the one at --url / $MODELPOOL_URL when given (an error when it does not
answer: starting another one elsewhere would surprise), where MODEL is an id or alias it
serves; else the default http://127.0.0.1:8000 when a server answers there; else a
`modelpool serve MODEL` child on a free loopback port (MODEL anything `serve` takes: a
catalog id, a .gguf file, a model folder, an `hf:` reference), stopped when `run` ends.
Either way the chat goes through the SDK, and the server loads the model on demand.

Interactive (stdin a terminal): a multi-turn chat; `/bye` or Ctrl-D ends it, `/clear`
forgets the history, Ctrl-C stops the reply being written (the request is closed, so the
server cancels the generation) and returns to the prompt. One-shot (a PROMPT, or a prompt
piped on stdin; both are joined): the reply on stdout and exit, for scripts. Errors are
one line on stderr and exit 1; an interrupted one-shot exits 130.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer

from modelpool.cli.admin import KeyOpt
from modelpool.cli.chat_session import ChatSession, ReplyOptions
from modelpool.cli.local_server import StartFailed, local_server, served_id
from modelpool.client import AdminClient, ClientError, ConnectionFailed
from modelpool.client.admin import DEFAULT_URL

MAX_STDIN_CHARS = 1_000_000
"""A piped prompt longer than this is refused here (the server would refuse it anyway)."""
READY_TIMEOUT_S = 600.0
PROBE_TIMEOUT_S = 2.0

UrlArg = Annotated[
    str | None,
    typer.Option("--url", envvar="MODELPOOL_URL", help=f"Server to chat through (default {DEFAULT_URL}, "
                 "else a server started for MODEL).", show_default=False),
]  # fmt: skip
ConfigOpt = Annotated[
    Path | None,
    typer.Option("--config", "-c", dir_okay=False, help="Config of the server started for MODEL (when none answers)."),
]


def run(
    model: Annotated[str, typer.Argument(help="Model id or alias (the server loads it on demand).")],
    prompt: Annotated[
        str | None, typer.Argument(help="Ask this once, print the reply and exit (piped stdin is added).")
    ] = None,
    url: UrlArg = None,
    api_key: KeyOpt = None,
    system: Annotated[str | None, typer.Option("--system", help="A system message the chat starts with.")] = None,
    max_tokens: Annotated[
        int | None, typer.Option("--max-tokens", min=1, max=1_048_576, help="Most tokens per reply.")
    ] = None,
    temperature: Annotated[float | None, typer.Option(min=0.0, max=2.0, help="Sampling temperature.")] = None,
    config: ConfigOpt = None,
) -> None:
    """Chat with a model in the terminal, streamed (one-shot with a PROMPT or piped stdin)."""
    question = one_shot_prompt(prompt)
    options = ReplyOptions(system=system, max_tokens=max_tokens, temperature=temperature)
    try:
        with _server(url, model, config) as (base_url, served_as):
            session = ChatSession(base_url, served_as, api_key, options)
            with session:
                session.wait_ready(READY_TIMEOUT_S)
                code = session.interactive() if question is None else session.one_shot(question)
    except (ClientError, StartFailed) as exc:
        _fail(exc.message if isinstance(exc, ClientError) else str(exc))
    except KeyboardInterrupt:
        typer.echo("", err=True)
        raise typer.Exit(130) from None
    raise typer.Exit(code)


def one_shot_prompt(prompt: str | None) -> str | None:
    """The one-shot question: the PROMPT argument and/or what is piped on stdin; None when
    neither (stdin a terminal and no PROMPT: the interactive chat)."""
    if sys.stdin is None or sys.stdin.isatty():
        return prompt
    piped = sys.stdin.read(MAX_STDIN_CHARS + 1)
    if len(piped) > MAX_STDIN_CHARS:
        _fail(f"the piped prompt is longer than {MAX_STDIN_CHARS:,} characters")
    parts = [part for part in (prompt, piped.strip()) if part]
    if not parts:
        _fail("nothing to ask: give a PROMPT, pipe one in, or run in a terminal to chat")
    return "\n\n".join(parts)


@contextlib.contextmanager
def _server(url: str | None, model: str, config: Path | None) -> Iterator[tuple[str, str]]:
    """The server to chat through (see the module's docstring) and the model's id there."""
    if url is not None:
        if not _answers(url):
            _fail(f"no server answers at {url} (unset --url/MODELPOOL_URL to have one started for {model})")
        yield url, model
        return
    if _answers(DEFAULT_URL):
        yield DEFAULT_URL, model
        return
    typer.secho(f"no server at {DEFAULT_URL}: starting one for {model}…", err=True, dim=True)
    with local_server(model, config) as started, AdminClient(started, timeout_s=30) as client:
        yield started, served_id(model, client.models())


def _answers(url: str) -> bool:
    """Whether an HTTP server answers at `url` (any answer: llama-server or vLLM have no
    /healthz, and are fine to chat through)."""
    with AdminClient(url, timeout_s=PROBE_TIMEOUT_S) as client:
        try:
            client.health()
        except ConnectionFailed:
            return False
        except (ClientError, ValueError):  # an error status, a body that is no JSON: it answered
            return True
    return True


def _fail(message: str) -> None:
    typer.secho(f"error: {message}", err=True, fg=typer.colors.RED)
    raise typer.Exit(1)
