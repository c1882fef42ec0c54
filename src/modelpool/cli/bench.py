"""`modelpool bench URL --model M`: load on any OpenAI-compatible server (modelpool, vLLM,
llama-server, OpenAI), a concurrency sweep, a summary table, and optionally the raw
per-request records (`--json`) and a chart (`--chart`). The work is `modelpool.loadgen`'s;
this is its command line: options, their bounds, the progress bar, the files."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import platform
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from modelpool import __version__
from modelpool.loadgen import LoadPlan, LoadSpec, LoadSpecError, RequestRecord
from modelpool.loadgen.audio import tone_wav
from modelpool.loadgen.chart import ChartError, write_chart
from modelpool.loadgen.report import notes, table, write_json
from modelpool.loadgen.runner import LevelRun, run_sweep
from modelpool.loadgen.spec import MAX_AUDIO_BYTES, MAX_PROMPT_CHARS, MAX_PROMPTS, Kind, parse_levels

MAX_PROMPT_FILE_BYTES = 64 * 1024 * 1024
DEFAULT_PROMPTS = {
    "chat": "Write a short story about a lighthouse keeper and a storm.",
    "completion": "Once upon a time, a lighthouse keeper",
    "embeddings": "A lighthouse keeper watches the storm roll in over the sea.",
    "transcription": "",
    "speech": "The lighthouse keeper lit the lamp as the storm came in.",
}


def bench(
    url: Annotated[str, typer.Argument(help="The server's base URL (with or without /v1).")],
    model: Annotated[str, typer.Option("--model", "-m", help="The model's id on that server.")],
    kind: Annotated[str, typer.Option(help="chat, completion, embeddings, transcription or speech.")] = "chat",
    concurrency: Annotated[str, typer.Option(help="Requests in flight; a comma list is a sweep: 1,4,16.")] = "1",
    requests: Annotated[int | None, typer.Option(help="Requests per level (default 32; or --duration).")] = None,
    duration: Annotated[float | None, typer.Option(help="Seconds per level instead of --requests.")] = None,
    stream: Annotated[bool, typer.Option(help="Stream chat/completion replies (TTFT, inter-token).")] = True,
    max_tokens: Annotated[int, typer.Option(help="max_tokens of each chat/completion request.")] = 64,
    prompt: Annotated[list[str] | None, typer.Option(help="A prompt (repeat for several; used in turn).")] = None,
    prompt_file: Annotated[
        Path | None, typer.Option(help="Prompts: .txt one a line, .jsonl with a prompt/text field, .json a list.")
    ] = None,
    warmup: Annotated[int, typer.Option(help="Requests sent (and not counted) before the first level.")] = 1,
    api_key_env: Annotated[
        str | None, typer.Option(help="The environment variable holding the API key (never the key itself).")
    ] = None,
    ignore_eos: Annotated[
        bool, typer.Option(help="Ask for max_tokens every time (where the server honours it).")
    ] = False,
    temperature: Annotated[float, typer.Option(help="Sampling temperature of chat/completion requests.")] = 0.0,
    timeout: Annotated[float, typer.Option(help="Seconds a request may take, connect to last byte.")] = 300.0,
    audio: Annotated[
        Path | None, typer.Option(help="A WAV file to transcribe (default: a generated 1 s tone).")
    ] = None,
    voice: Annotated[str, typer.Option(help="The voice of speech requests.")] = "alloy",
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the summaries and raw records there.")] = None,
    chart: Annotated[Path | None, typer.Option(help="Write a chart there (.svg or .png).")] = None,
    progress: Annotated[bool, typer.Option(help="Show a progress bar on stderr.")] = True,
) -> None:
    """Load-test an OpenAI-compatible server: tokens/s, TTFT, inter-token and request latency, errors."""
    err = Console(stderr=True)
    try:
        spec = LoadSpec(
            base_url=url, model=model, kind=_kind(kind), prompts=_prompts(kind, prompt, prompt_file),
            max_tokens=max_tokens, stream=stream, ignore_eos=ignore_eos, temperature=temperature, timeout_s=timeout,
            api_key=_api_key(api_key_env), audio=_audio(kind, audio), audio_name=audio.name if audio else "tone.wav",
            voice=voice,
        )  # fmt: skip
        count = requests if requests is not None or duration is not None else 32  # neither: 32 requests
        plan = LoadPlan(parse_levels(concurrency), count, duration, warmup)
        if chart is not None and chart.suffix.lower() not in (".svg", ".png"):
            raise ChartError(f"chart: {chart.name} must end in .svg or .png")
        _check_writable("json", json_out)
        _check_writable("chart", chart)
    except (LoadSpecError, ChartError) as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(2) from None
    warm, runs = _run(spec, plan, err if progress else None)
    out = Console()
    if not out.is_terminal:
        out = Console(width=200)  # a file or a pipe: the whole table on one line per level
    out.print(table(spec, runs))
    for line in notes(spec, runs):
        out.print(line, highlight=False)
    _write_files(spec, plan, warm, runs, json_out, chart)
    if not any(run.summary.succeeded for run in runs):
        typer.echo("error: no request succeeded (see the errors column)", err=True)
        raise typer.Exit(1)


def _check_writable(setting: str, path: Path | None) -> None:
    """Refuse an output file that could not be written, before any request is sent: the
    files are written after the whole run, which would then be lost. A probe file is made
    and removed in the folder (permissions alone say nothing when running as root)."""
    if path is None:
        return
    if path.is_dir():
        raise LoadSpecError(f"{setting}: {path} is a folder, not a file")
    folder = path.parent
    if not folder.is_dir():
        raise LoadSpecError(f"{setting}: cannot write {path}: the folder {folder} does not exist")
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
        if path.exists() and not os.access(path, os.W_OK):
            raise PermissionError(errno.EACCES, "permission denied")
    except OSError as error:
        raise LoadSpecError(f"{setting}: cannot write {path}: {error.strerror}") from None


def _kind(kind: str) -> Kind:
    from modelpool.loadgen.spec import KINDS

    for known in KINDS:
        if known == kind:
            return known
    raise LoadSpecError(f"kind: {kind!r} is not one of {', '.join(KINDS)}")


def _api_key(variable: str | None) -> str | None:
    if variable is None:
        return None
    key = os.environ.get(variable)
    if not key:
        raise LoadSpecError(f"api-key-env: the environment variable {variable} is not set")
    return key


def _audio(kind: str, path: Path | None) -> bytes:
    if kind != "transcription":
        return b""
    if path is None:
        return tone_wav()
    try:
        if path.stat().st_size > MAX_AUDIO_BYTES:
            raise LoadSpecError(f"audio: {path} is over {MAX_AUDIO_BYTES} bytes")
        return path.read_bytes()
    except OSError as error:
        raise LoadSpecError(f"audio: cannot read {path}: {error.strerror}") from None


def _prompts(kind: str, given: list[str] | None, path: Path | None) -> tuple[str, ...]:
    prompts = list(given or [])
    if path is not None:
        prompts += _prompt_file(path)
    if kind == "transcription":
        return ("(audio)",)  # the audio is the input; the prompt only indexes requests
    return tuple(prompts) or (DEFAULT_PROMPTS.get(kind) or DEFAULT_PROMPTS["chat"],)


def _prompt_file(path: Path) -> list[str]:
    """.txt: one prompt a line; .jsonl: objects with `prompt` or `text`; .json: a list of strings."""
    try:
        if path.stat().st_size > MAX_PROMPT_FILE_BYTES:
            raise LoadSpecError(f"prompt-file: {path} is over {MAX_PROMPT_FILE_BYTES} bytes")
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise LoadSpecError(f"prompt-file: cannot read {path}: {error}") from None
    try:
        if path.suffix == ".jsonl":
            rows = [json.loads(line) for line in text.splitlines() if line.strip()]
            prompts = [row.get("prompt") or row.get("text") if isinstance(row, dict) else None for row in rows]
        elif path.suffix == ".json":
            prompts = json.loads(text)
        else:
            prompts = [line for line in text.splitlines() if line.strip()]
    except ValueError as error:
        raise LoadSpecError(f"prompt-file: {path} is not valid JSON: {error}") from None
    if not isinstance(prompts, list) or not all(isinstance(p, str) and p for p in prompts):
        raise LoadSpecError(f"prompt-file: {path} must give non-empty strings (prompt/text fields in .jsonl)")
    if len(prompts) > MAX_PROMPTS or any(len(p) > MAX_PROMPT_CHARS for p in prompts):
        raise LoadSpecError(f"prompt-file: at most {MAX_PROMPTS} prompts of {MAX_PROMPT_CHARS} characters")
    return prompts


def _run(spec: LoadSpec, plan: LoadPlan, err: Console | None) -> tuple[list[RequestRecord], list[LevelRun]]:
    if err is None:
        return asyncio.run(run_sweep(spec, plan))
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=err, transient=False) as bar:

        def level(concurrency: int) -> object:
            task = bar.add_task(f"concurrency {concurrency}", total=plan.requests)
            return lambda record: bar.advance(task)

        return asyncio.run(run_sweep(spec, plan, progress=level))  # type: ignore[arg-type]


def _write_files(
    spec: LoadSpec,
    plan: LoadPlan,
    warm: list[RequestRecord],
    runs: list[LevelRun],
    out: Path | None,
    chart: Path | None,
) -> None:
    if out is not None:
        machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
        meta = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "modelpool": __version__}
        write_json(out, spec, plan, warm, runs, **meta, machine=machine)
    if chart is not None:
        write_chart(chart, f"{spec.kind} · {spec.model}", spec.kind, runs)
