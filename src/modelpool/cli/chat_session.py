"""One terminal chat with a model through the SDK (`modelpool run`): the history, each reply
written as it streams, and Ctrl-C that stops a reply without leaving work on the server.

Each reply runs as its own task on one event loop (kept across turns, with the SDK's
connection pool). Ctrl-C cancels that task instead of breaking into the loop: the SDK's
stream closes its HTTP response on the way out, the server sees the client gone and
cancels the generation, and KeyboardInterrupt is raised here, where the chat carries on
with the next prompt. (asyncio.Runner does the same, from Python 3.11 only.)
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import Coroutine
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeVar

import typer

from modelpool.client import ChatMessage, ChatOptions, ClientError, make_llm, parse_models_config

PROMPT = ">>> "
HELP = "Send a message; /clear forgets the chat, /bye or Ctrl-D ends it, Ctrl-C stops a reply."
ROLE = "run"
KEY_VARIABLE = "MODELPOOL_API_KEY"
T = TypeVar("T")


@dataclass(frozen=True)
class ReplyOptions:
    system: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None


class ChatSession:
    def __init__(self, base_url: str, model: str, api_key: str | None, options: ReplyOptions) -> None:
        # The SDK reads a key from the variable an endpoint names; the key given on the
        # command line is handed over under that name, in a mapping of its own.
        # openai_compat: any OpenAI-compatible server (readiness: modelpool's /readyz?model=,
        # else /health, else /v1/models).
        endpoint = {"kind": "openai_compat", "base_url": base_url, "model_name": model}
        if api_key:
            endpoint["api_key_env"] = KEY_VARIABLE
        config = parse_models_config({ROLE: endpoint}, environ={KEY_VARIABLE: api_key} if api_key else {})
        self._llm = make_llm(config, ROLE)
        self._options = options
        self._runner = InterruptibleLoop()
        self._colour = sys.stdout.isatty()
        self.history: list[ChatMessage] = self._fresh_history()

    def __enter__(self) -> ChatSession:
        return self

    def __exit__(
        self, _type: type[BaseException] | None, _exc: BaseException | None, _tb: TracebackType | None
    ) -> None:
        with contextlib.suppress(Exception, KeyboardInterrupt):
            self._runner.run(self._llm.aclose())
        self._runner.close()

    def wait_ready(self, timeout_s: float) -> None:
        """Until the server can serve the model (it loads on demand); an unknown model, a bad
        key or a model that failed to load raise at once."""
        self._runner.run(self._llm.wait_ready(timeout_s))

    def one_shot(self, question: str) -> int:
        """The reply on stdout; Ctrl-C raises KeyboardInterrupt (the caller exits 130)."""
        self._runner.run(self._reply(question))
        return 0

    def interactive(self) -> int:
        with contextlib.suppress(ImportError):
            import readline  # noqa: F401  (line editing and history for input())
        typer.secho(HELP, dim=True)
        while (text := self._ask()) is not None:
            if text == "/bye":
                break
            if text == "/clear":
                self.history = self._fresh_history()
            elif text:
                self._turn(text)
        return 0

    def _ask(self) -> str | None:
        """The next message; None at end of input (Ctrl-D); "" after a Ctrl-C at the prompt."""
        try:
            return input(PROMPT).strip()
        except EOFError:
            typer.echo()
            return None
        except KeyboardInterrupt:
            typer.secho("\nUse Ctrl-D or /bye to exit.", dim=True)
            return ""

    def _turn(self, text: str) -> None:
        try:
            self._runner.run(self._reply(text))
        except KeyboardInterrupt:
            typer.secho("\n(stopped)", dim=True)
        except ClientError as exc:  # the chat goes on: the next message may fare better
            typer.secho(f"error: {exc.message}", err=True, fg=typer.colors.RED)

    async def _reply(self, text: str) -> None:
        """Stream one reply to stdout; the turn joins the history even when cut short (what
        was seen is what the model said), not when the request failed."""
        user, pieces = ChatMessage.user(text), []
        try:
            async for delta in self._llm.stream_chat([*self.history, user], **self._chat_options()):
                if delta.reasoning and self._colour:
                    self._write(typer.style(delta.reasoning, dim=True))
                if delta.content:
                    pieces.append(delta.content)
                    self._write(delta.content)
        except asyncio.CancelledError:
            if pieces:
                self.history += [user, ChatMessage.assistant("".join(pieces))]
            raise
        self._write("\n")
        self.history += [user, ChatMessage.assistant("".join(pieces))]

    def _chat_options(self) -> ChatOptions:
        return ChatOptions(max_tokens=self._options.max_tokens, temperature=self._options.temperature)

    def _fresh_history(self) -> list[ChatMessage]:
        return [ChatMessage.system(self._options.system)] if self._options.system else []

    @staticmethod
    def _write(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()


class InterruptibleLoop:
    """An event loop on which Ctrl-C cancels the running task and then raises
    KeyboardInterrupt, so the task's clean-up (closing a stream) runs first."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()

    def run(self, work: Coroutine[Any, Any, T]) -> T:
        task = self._loop.create_task(work)
        interrupted = False

        def interrupt() -> None:
            nonlocal interrupted
            interrupted = True
            task.cancel()

        handled = self._on_sigint(interrupt)
        try:
            return self._loop.run_until_complete(task)
        except KeyboardInterrupt:  # no handler (not the main thread): still let the task clean up
            task.cancel()
            with contextlib.suppress(BaseException):
                self._loop.run_until_complete(task)
            raise
        except asyncio.CancelledError:
            if interrupted:
                raise KeyboardInterrupt from None
            raise
        finally:
            if handled:
                self._loop.remove_signal_handler(signal.SIGINT)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._loop.run_until_complete(self._loop.shutdown_asyncgens())
        self._loop.close()

    def _on_sigint(self, callback: Any) -> bool:
        try:
            self._loop.add_signal_handler(signal.SIGINT, callback)
        except (ValueError, RuntimeError, NotImplementedError):  # not the main thread; Windows
            return False
        return True
