"""The typed configuration: what a config file may say, with a docstring on every field.

The docstrings double as the field descriptions in the published JSON schema
(``modelpool config-schema``) and in the config reference of docs/configuration.md
(``modelpool config-reference``), so keep them user-facing.
"""

from __future__ import annotations

import re
from enum import Enum
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ByteSize, ConfigDict, Field, field_validator, model_validator

from modelpool.config.durations import Duration
from modelpool.config.memory_share import MemoryShare
from modelpool.config.ray import RayModelConfig, RaySettings
from modelpool.owner import Priority
from modelpool.tasks import Task

MODEL_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:/+-]*$"
ADAPTER_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
"""An adapter's name: what follows the base model's id in `model: "base:adapter"` (no `:` or `/`)."""
_CORS_ORIGIN = re.compile(r"^(\*|[A-Za-z][A-Za-z0-9+.-]*://[^/\s]+)$")
"""`*`, or scheme://host[:port] as browsers send it in `Origin` (no path, no trailing slash)."""
_ALLOWED_HOST = re.compile(r"^(\*|(\*\.)?[A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\])(:\d{1,5})?$")
"""A `Host` header value: name, `*.domain` or `[ipv6]`, with an optional port; `*` alone: any."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


class LogFormat(str, Enum):
    TEXT = "text"
    JSON = "json"


class ServerConfig(_Strict):
    host: str = "127.0.0.1"
    """Interface the HTTP server binds to. Keep the loopback default unless you add auth."""

    port: int = Field(default=8000, ge=0, le=65535)
    """TCP port of the HTTP server (0 picks a free port)."""

    max_body_bytes: int = Field(default=16 * 1024 * 1024, gt=0)
    """Largest request body accepted; bigger bodies get 413 before they are read whole."""

    max_upload_bytes: int = Field(default=25 * 1024 * 1024, gt=0)
    """Largest audio upload (/v1/audio/transcriptions and /translations), checked the same way."""

    header_timeout_s: float = Field(default=10.0, gt=0)
    """A connection must finish sending a request's headers within this long of opening (or
    of its previous response), or it is closed: a client trickling headers cannot hold a
    socket for ever (nginx's client_header_timeout)."""

    body_timeout_s: float = Field(default=60.0, gt=0)
    """Longest wait for the next piece of a request body that is still coming; past it the
    request gets 408 (nginx's client_body_timeout)."""

    max_connections: int | None = Field(default=None, ge=1)
    """Most open client connections; more are closed as they arrive. Default: three quarters
    of the process's open-file limit, so the server never runs out of file descriptors."""

    forwarded_allow_ips: list[str] = Field(default_factory=list)
    """Addresses of reverse proxies in front of this server whose `X-Forwarded-For` and
    `X-Forwarded-Proto` are believed (the client address per-address rate limits and the
    access log see). Empty: those headers are ignored, since any client could send them."""

    max_audio_seconds: float = Field(default=7200.0, gt=0)
    """Longest audio transcribed from one upload, MCP `transcribe` call or live session (all
    it sends); longer gets 413 `request_too_large`. Checked while decoding, before the
    samples are kept: a few MB of compressed silence can hold hours. The default, 2 hours,
    holds any 25 MiB upload of speech at 32 kbit/s or more (a 16 kHz WAV is 14 minutes, a
    64 kbit/s mp3 55); decoded, 2 hours at Whisper's 16 kHz take 460 MB."""

    audio_budget_seconds: float = Field(default=4 * 3600.0, gt=0)
    """Decoded audio all transcriptions together may hold at once (an upload holds its
    samples until its transcript ends): 4 hours, 920 MB at Whisper's 16 kHz. A transcription
    that finds the budget spent waits up to `model_wait_s` for others to finish, then gets
    429 `overloaded`. At least `max_audio_seconds`."""

    log_format: LogFormat = LogFormat.TEXT
    """`text` for people, `json` for one JSON object a line (log shippers)."""

    log_level: str = Field(default="info", pattern=r"^(?i:debug|info|warning|error|critical)$")
    """Lowest level that is logged: debug, info, warning, error or critical."""

    model_wait_s: float = Field(default=120.0, ge=0)
    """How long a request waits for its model to finish loading before it gets 503
    `model_not_ready` with a Retry-After header."""

    timing_metrics: bool = False
    """Add a `metrics` object (queue wait, load wait, backend time, time to first token,
    tokens/s) to every response, not only to requests that ask with `return_metrics`."""

    response_store_size: int = Field(default=1024, ge=0)
    """Responses kept for `previous_response_id` (LRU, in memory; 0 keeps none). Each key
    reads only the responses it stored (a key with the admin scope reads all). Past it the
    key holding the most gives up its least recently used: one key cannot push out another's."""

    response_store_bytes: int = Field(default=256 * 1024 * 1024, ge=0)
    """Memory the stored responses may take together, estimated from each stored
    conversation's text and images and the response object kept for retrieval; past it the
    key holding the most bytes gives up its least recently used, and a single conversation
    larger than it is not stored."""

    shutdown_grace_s: float = Field(default=30.0, ge=0)
    """On SIGTERM/SIGINT, how long in-flight requests may run before the server stops anyway."""

    stream_send_timeout_s: float = Field(default=30.0, gt=0)
    """A streamed response (SSE, streamed audio) whose client takes no data for this long
    (one send blocked on a full socket) is cut: the connection closes and the model's turn
    goes back, so clients that stop reading cannot hold a model's turns."""

    realtime_idle_timeout_s: float = Field(default=60.0, gt=0)
    """A live transcription session (`/v1/realtime`) that sends nothing for this long is
    closed (an `error` event, then close code 1000)."""

    realtime_sessions: int = Field(default=32, ge=1)
    """Live transcription sessions open at once, all keys together; one more is told
    `too_many_sessions` and closed with code 1013 (try again later). Each holds its queue of
    events (up to ~20 MB) and a worker thread's share while it sends."""

    realtime_sessions_per_key: int = Field(default=8, ge=1)
    """Live transcription sessions one API key may hold open at once (with `auth.keys`; the
    anonymous caller of a server without keys is bound by `realtime_sessions` only)."""

    realtime_queue_events: int = Field(default=8, ge=1)
    """Client events a live transcription session holds while its model works. When they
    are full the server stops reading the socket, so TCP slows a client that sends faster
    than real time instead of the server buffering its audio."""

    cors_origins: list[str] = Field(default_factory=list)
    """Web origins whose browser scripts may call the API (`https://app.example.com`, no
    path; `*`: any). Empty: CORS is off. Preflights are answered without an API key."""

    cors_allow_credentials: bool = False
    """Let browsers send cookies and HTTP auth with cross-origin requests (modelpool itself
    uses neither: API keys travel in the Authorization header). Not with `*`."""

    cors_allow_any_with_keys: bool = False
    """Allow `cors_origins: ["*"]` although API keys are configured (any web page could then
    call the server with a key its user holds)."""

    @field_validator("cors_origins")
    @classmethod
    def _origins(cls, origins: list[str]) -> list[str]:
        # A browser's Origin never ends in a slash or has a path: such an entry would match nothing.
        for origin in origins:
            if not _CORS_ORIGIN.match(origin):
                raise ValueError(f"'{origin}' is not an origin: write scheme://host[:port] (no path) or '*'")
        return origins

    allowed_hosts: list[str] = Field(default_factory=list)
    """Names clients may reach the server by (the `Host` header: `gpu-box.lan`,
    `api.example.com:443`, `*.example.com`; `*`: any), besides loopback names (`localhost`,
    `127.x.x.x`, `[::1]`, any port), which are always accepted. On a loopback bind any other
    Host is refused (421), so a web page whose DNS name is rebound to 127.0.0.1 cannot call
    the server. Bound beyond loopback, an empty list accepts any Host (the API keys guard
    the server); list names to refuse the rest there too. With `cors_origins: ["*"]` no
    Host is refused (any page may call anyway)."""

    api_docs: bool = False
    """Serve the interactive API docs at `/docs` (Swagger UI) and `/redoc`. Off by default:
    those pages load their scripts from a CDN (cdn.jsdelivr.net) into a page on this
    server's origin. `/openapi.json` is served either way."""

    @field_validator("allowed_hosts")
    @classmethod
    def _hosts(cls, hosts: list[str]) -> list[str]:
        # What a Host header holds: a name (or `*.suffix`) and an optional port, no scheme or path.
        for host in hosts:
            if not _ALLOWED_HOST.match(host):
                raise ValueError(f"'{host}' is not a host: write name[:port] or *.domain[:port] (no scheme, no path)")
        return [host.lower() for host in hosts]

    allow_remote_images: bool = False
    """Fetch `http(s)://` image URLs in requests. Off: only data URIs (and allowed files).
    Fetches never reach loopback, private, link-local or metadata addresses."""

    image_fetch_allowed_hosts: list[str] = Field(default_factory=list)
    """Hosts fetched although they resolve to a private address (an internal media server)."""

    allowed_local_media_dirs: list[Path] = Field(default_factory=list)
    """Directories `file://` image URLs may point into (none: no local files)."""

    max_image_bytes: int = Field(default=20 * 1024 * 1024, gt=0)
    """Largest image accepted (413 above it)."""

    max_image_pixels: int = Field(default=40_000_000, gt=0)
    """Most pixels (width × height) an image may have (413 above it)."""

    image_fetch_timeout_s: float = Field(default=10.0, gt=0)
    """Longest a remote image fetch may take, redirects included."""

    max_images_per_request: int = Field(default=16, ge=1)
    """Most images one request may carry, whatever the model (each backend may allow fewer:
    its `max_images` option); 400 above it, before any image is fetched or decoded."""

    max_request_image_pixels: int = Field(default=80_000_000, gt=0)
    """Most pixels all the images of one request may have together, read from their headers
    before any is decoded (413 above it). Bounds the memory one request's images take; a
    video's sampled frames share it (scaled down to what the images leave, split evenly)."""

    max_video_bytes: int = Field(default=64 * 1024 * 1024, gt=0, le=2 * 1024**3)
    """Largest video (`video_url` part) accepted (413 above it). Videos come from the same
    places as images (data URIs, `allow_remote_images`, `allowed_local_media_dirs`)."""

    max_video_seconds: float = Field(default=600.0, gt=0, le=86_400)
    """Longest video, as its header declares it and as it decodes (413 above it)."""

    max_video_pixels: int = Field(default=3840 * 2160, gt=0, le=100_000_000)
    """Most pixels one video frame may have, read from the header before decoding (413 above it)."""

    max_videos_per_request: int = Field(default=2, ge=1, le=64)
    """Most videos one request may carry; 400 above it, before any is read."""

    max_schema_bytes: int = Field(default=256 * 1024, gt=0)
    """Most bytes of JSON schema one request may carry, its tools' `parameters` and its
    `response_format` together (counted as compact JSON); 413 above it, before the schemas
    are checked or compiled."""

    max_schema_nodes: int = Field(default=10_000, gt=0)
    """Most JSON values (objects, arrays, strings, numbers...) in one request's schemas
    together; 413 above it. A schema check costs about 0.1 ms of CPU per subschema."""

    max_schema_depth: int = Field(default=64, gt=0)
    """Deepest nesting of objects and arrays in a request's JSON schema; 413 above it."""

    max_tools: int = Field(default=128, ge=0, le=128)
    """Most tool definitions one request may carry (413 above it; 128 is OpenAI's limit and
    the wire's own)."""

    max_template_kwargs_bytes: int = Field(default=16 * 1024, gt=0)
    """Largest `chat_template_kwargs` a request may send (counted as compact JSON); 413 above it."""

    ui: bool = True
    """Serve the workbench, a web UI over the pool, at `/ui` (its calls go through the API,
    so API keys and their scopes apply to it as to any client)."""

    mcp: bool = True
    """Serve the MCP server (streamable HTTP) at `/mcp`: tools over the pool and the
    transcript store, behind the same API keys (`inference` scope)."""

    transcript_dir: Path | None = None
    """Where the transcript store keeps its files, one JSONL file per source (default:
    `transcripts` under `work_dir`). Each key reads only the sources it wrote (a key with
    the admin scope reads all)."""

    transcript_max_sources: int = Field(default=10_000, ge=1)
    """Sources the transcript store holds, every key's together; adding to a new source
    past it is refused (413 `store_full`)."""

    transcript_max_entries_per_source: int = Field(default=100_000, ge=1)
    """Entries one transcript source holds; adding past it is refused (413 `store_full`)."""

    transcript_max_bytes: int = Field(default=128 * 1024 * 1024, ge=1)
    """Bytes the transcript store's files take together (the store also holds them all in
    memory); adding past it is refused (413 `store_full`)."""

    transcript_max_speaker_chars: int = Field(default=128, ge=1)
    """Longest `speaker` name of a transcript entry (400 above it)."""

    otel_endpoint: str | None = Field(default=None, pattern=r"^https?://\S+$")
    """OTLP/HTTP traces URL of an OpenTelemetry collector (`http://collector:4318/v1/traces`):
    every HTTP request is then traced — a server span, its wait for the model, the model's
    work, with tokens — and a caller's W3C `traceparent` is continued. Needs
    `pip install 'modelpool[otel]'`. None: no tracing (the OpenTelemetry SDK is not even loaded)."""

    otel_service_name: str = Field(default="modelpool", min_length=1)
    """`service.name` of the traces this server sends (tells several servers apart)."""

    watch_config: bool = False
    """Re-read the config file (and its `.local` override) when it changes on disk and apply
    the difference, as `POST /v1/admin/reload` and SIGHUP do (`modelpool serve --watch-config`).
    Needs a config file; not in Ray mode."""


class Scope(str, Enum):
    INFERENCE = "inference"
    ADMIN = "admin"


class RateLimits(_Strict):
    requests_per_minute: int | None = Field(default=None, ge=1)
    """Most requests a minute on the inference routes; none: unlimited (refilled evenly,
    limit/60 a second, so a minute's worth may come in a burst)."""
    tokens_per_minute: int | None = Field(default=None, ge=1)
    """Most tokens (input + output) a minute; none: unlimited. Charged when a request ends,
    so one request may overdraw it; the next waits until it refills."""


MAX_WEIGHT = 1000


class SchedulingClass(_Strict):
    """Where a caller's requests go in a model's queue (see docs/scheduling.md)."""

    priority: Priority = Priority.NORMAL
    """`high`, `normal` or `low`: waiting requests of a higher class get turns first (a
    request ages one class up every `priority_aging_s` in line, so none starves)."""
    weight: int = Field(default=1, ge=1, le=MAX_WEIGHT)
    """Share of turns against other callers of the same class while both have requests
    waiting: a weight-2 key gets two turns for each one of a weight-1 key."""


class ApiKeyConfig(SchedulingClass):
    name: str
    """Who holds the key (shown in logs instead of the key)."""
    scopes: list[Scope] = Field(default_factory=lambda: [Scope.INFERENCE])
    """`inference` (the /v1 model routes) and/or `admin` (/v1/admin)."""
    key_env: str | None = None
    """Name of the environment variable holding the key."""
    sha256: str | None = Field(default=None, pattern=r"^[0-9a-fA-F]{64}$")
    """Hex SHA-256 of the key, for keys that should not sit in the environment."""
    requests_per_minute: int | None = Field(default=None, ge=1)
    """Most requests a minute this key may make on the inference routes; none: unlimited.
    A full minute's worth may come in a burst, then the budget refills evenly (limit/60 a
    second). Over it: 429 `rate_limit_exceeded` with Retry-After. Keys sharing a `name`
    share their budgets and usage."""
    tokens_per_minute: int | None = Field(default=None, ge=1)
    """Most tokens (input + output) a minute this key may use; none: unlimited. A
    request's tokens are known only when it ends, so they are charged then: a request is
    let in while any of the budget is left and may overdraw it once; the next waits until
    it refills."""

    @model_validator(mode="before")
    @classmethod
    def _scheduling_named(cls, data: Any) -> Any:
        """A bad priority or weight is reported with the key's name (a list index is no help)."""
        if not isinstance(data, dict):
            return data
        name = data.get("name", "?")
        priority = data.get("priority", Priority.NORMAL.value)
        if priority not in {p.value for p in Priority}:
            raise ValueError(f"api key '{name}': priority must be one of high, normal, low (got {priority!r})")
        weight = data.get("weight", 1)
        if isinstance(weight, bool) or not isinstance(weight, int) or not 1 <= weight <= MAX_WEIGHT:
            raise ValueError(f"api key '{name}': weight must be a whole number from 1 to {MAX_WEIGHT} (got {weight!r})")
        return data

    @model_validator(mode="after")
    def _one_source(self) -> ApiKeyConfig:
        if (self.key_env is None) == (self.sha256 is None):
            raise ValueError(f"api key '{self.name}': give exactly one of key_env or sha256")
        return self


class AuthConfig(_Strict):
    keys: list[ApiKeyConfig] = Field(default_factory=list)
    """API keys accepted as `Authorization: Bearer <key>`. None: no auth (loopback only)."""
    allow_unauthenticated_remote: bool = False
    """Serve on a non-loopback address with no API keys. Off: such a start is refused."""
    unauthenticated: RateLimits = Field(default_factory=RateLimits)
    """Rate limits when no API keys are configured, kept per client address (each address
    has its own budget: with no keys, the address is all that tells callers apart; behind a
    proxy, they all share the proxy's). Unlimited by default."""
    unauthenticated_scheduling: SchedulingClass = Field(default_factory=SchedulingClass)
    """Queue class and weight when no API keys are configured: each client address is one
    caller sharing fairly with the others (as rate limits are kept per address)."""

    @model_validator(mode="after")
    def _one_budget_per_name(self) -> AuthConfig:
        limits: dict[str, tuple[int | None, int | None]] = {}
        classes: dict[str, tuple[Priority, int]] = {}
        for key in self.keys:
            mine = (key.requests_per_minute, key.tokens_per_minute)
            if limits.setdefault(key.name, mine) != mine:
                raise ValueError(f"api keys named '{key.name}' share one budget: give them the same rate limits")
            share = (key.priority, key.weight)
            if classes.setdefault(key.name, share) != share:
                raise ValueError(f"api keys named '{key.name}' share one queue share: give them the same "
                                 "priority and weight")  # fmt: skip
        return self


class PoolConfig(_Strict):
    max_loaded_models: int | None = Field(default=None, ge=1)
    """Most models loaded at once; least recently used idle ones are unloaded to make room."""
    memory_budget_bytes: MemoryShare = "75%"
    """RAM modelpool may use in all — its own baseline, the engines' runtimes (torch,
    onnxruntime, ...) and the loaded models: bytes (`8GiB`), a share of the machine's memory
    (`75%`, of the container's limit when that is lower) or `none` for no limit. Past it, the
    least recently used idle models are unloaded to make room (see docs/memory.md)."""
    gpu_memory_budget_bytes: MemoryShare = "90%"
    """GPU memory the loaded models may use in all, when a GPU is seen: bytes, a share of the
    GPUs' memory (`90%`, less what was already in use when modelpool started) or `none`."""
    swap_after_s: float = Field(default=10.0, ge=0, le=3600)
    """A model with requests running or waiting is not unloaded to load another: the load
    waits (that model serves its own requests first) until it is idle. After this many
    seconds of waiting the busy model is drained anyway (its running requests finish), so a
    busy model cannot keep another out forever (see docs/scheduling.md)."""
    reap_interval_s: float = Field(default=1.0, gt=0)
    """How often idle models are checked against their keep_alive."""
    reload_wait_s: float = Field(default=60.0, ge=0, le=86400)
    """A model a config reload changed keeps serving its old settings until it is idle; after
    this many seconds still busy it is drained anyway (its running requests finish on the
    old engine, those waiting are served by the new one), so steady traffic cannot keep an
    old config (an adapter the operator removed, say) serving for ever."""


class BatchConfig(_Strict):
    max_batch_size: int = Field(default=64, ge=1)
    """Most inputs run in one batch."""
    max_batch_tokens: int = Field(default=16384, ge=1)
    """Most tokens (padded) in one batch."""
    window_ms: float = Field(default=2.0, ge=0)
    """How long the first request of a batch waits for others to join it; 0: no wait."""
    max_window_ms: float = Field(default=20.0, ge=0, le=10_000)
    """While inputs keep arriving (a burst the server is still reading), the batch waits
    another `window_ms`, up to this long in all (never less than one `window_ms`)."""


class SamplingDefaults(_Strict):
    """Used for any sampling field a request leaves out (the model card's recommendations)."""

    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    """Default temperature (OpenAI's default is 1.0)."""
    top_p: float | None = Field(default=None, ge=0.0, le=1.0)
    """Default nucleus-sampling mass."""
    top_k: int | None = Field(default=None, ge=0)
    """Default top-k (0 disables it)."""
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    """Default min-p."""
    repetition_penalty: float | None = Field(default=None, gt=0.0)
    """Default repetition penalty (1.0 disables it)."""
    max_tokens: int | None = Field(default=None, ge=1)
    """Default cap on generated tokens for a generating request that sets none (chat,
    `/v1/completions`, `/v1/responses`, `/generate`)."""


MODELLESS_TASKS = (Task.COMPLETION, Task.SCORING, Task.EMBEDDING, Task.RERANK)
"""Tasks whose routes accept a body without `model`, as the HRM serving contract's v1
bodies (`/generate`, `/loglikelihood`) and llama-server's (`/embedding`, `/embeddings`,
`/reranking`) are."""


class ServerDefaults(_Strict):
    """What applies to every model unless the model or the request says otherwise."""

    sampling: SamplingDefaults = Field(default_factory=SamplingDefaults)
    """Server-wide sampling defaults (e.g. the HRM contract's `max_tokens: 128`,
    `temperature: 0.7`): a field a model's own `sampling` leaves unset takes this value.
    Precedence: the request, then the model's `sampling`, then this, then the protocol's
    own default (OpenAI's: temperature 1.0; `/v1/completions` and `/generate`: 16 tokens)."""

    models: dict[Task, str] = Field(default_factory=dict, max_length=len(MODELLESS_TASKS))
    """Task → the model (id or alias) a body without `model` uses: `completion` for
    `/generate` and `/generate_stream`, `scoring` for `/loglikelihood`, `embedding` for `/embedding` and
    `/embeddings`, `rerank` for the rerank routes. Unset: the only
    served model that does the task; with several, the request must name one (400 listing them)."""

    @field_validator("models")
    @classmethod
    def _modelless_tasks_only(cls, value: dict[Task, str]) -> dict[Task, str]:
        for task in value:
            if task not in MODELLESS_TASKS:
                can = ", ".join(t.value for t in MODELLESS_TASKS)
                raise ValueError(f"defaults.models: no route takes a body without `model` for {task.value} ({can} do)")
        return value


class AdapterConfig(_Strict):
    source: str = Field(min_length=1)
    """Where the adapter is, as a model's `source`: a local path (relative to the config file),
    `package:PKG/path` or `hf:org/repo[:file]`. llama_cpp: a LoRA GGUF file; transformers: a PEFT
    adapter folder (adapter_config.json + adapter_model.safetensors)."""

    scale: float = Field(default=1.0, ge=-8.0, le=8.0)
    """How strongly the adapter's update is applied (llama.cpp's `--lora-scaled`); 1 as trained."""

    preload: bool = False
    """Load the adapter with its model instead of on the first request that names it."""


class ModelConfig(_Strict):
    id: str = Field(pattern=MODEL_ID_PATTERN)
    """Public model id clients put in `model`. Taken from the key under `models:`."""

    backend: str
    """Engine that runs the model: `llama_cpp`, `sentence_transformers`, `cross_encoder`, `transformers`,
    `ctranslate2`, `faster_whisper`, `piper`, `kokoro`, `llama_server`, `vllm_serve`, `vllm` (vLLM in process)
    or `openai_remote` — or your own backend class as `package.module:Class` (see the contract in
    `modelpool/backends/base.py`). A config file may leave it out: it is then detected from the `source`'s
    files, with the tasks and options the entry does not set (docs/models.md)."""

    source: str | None = None
    """Where the weights are: a local path (relative to the config file),
    `package:PKG/relative/path` (inside an installed Python package) or
    `hf:org/repo[:file]` (through the Hugging Face cache). Not needed by `openai_remote`."""

    assemble: dict[str, list[str]] = Field(default_factory=dict)
    """Files shipped in parts (a weights file split across packages): file name → its parts
    in order, each a path, `package:` or `hf:` source. They are joined once into
    `work_dir/assembled`, beside links to the other files of the `source` folder, with a
    sha256 checked on every load (a corrupt copy is joined again); the model loads from there."""

    tasks: list[Task] | None = None
    """What the model may be used for (chat, completion, embedding, ...). Defaults to
    everything its backend can do."""

    aliases: list[str] = Field(default_factory=list)
    """Other names that resolve to this model."""

    description: str = ""
    """One line shown by `modelpool models` and `/v1/models`."""

    owned_by: str = "modelpool"
    """`owned_by` reported in `/v1/models`."""

    preload: bool = True
    """Load at server start; `/readyz` answers 200 only once every preloaded model is ready."""

    max_concurrency: int | None = Field(default=None, ge=1)
    """Requests one replica runs at once; the rest wait their turn. Default: what the engine
    can run at once (`parallel` for llama.cpp, `max_batch_size` for transformers)."""

    max_queue: int = Field(default=64, ge=0)
    """Requests that may wait per replica; beyond that, 429 `overloaded` at once."""

    max_queue_per_key: int | None = Field(default=None, ge=1, le=100_000)
    """Requests one caller (an API key's name, or a client address without keys) may have
    waiting per replica; beyond that, 429 `overloaded` for that caller alone. None: three
    quarters of `max_queue` rounded up, so a flooding caller always leaves room for others
    (see docs/scheduling.md)."""

    priority_aging_s: float = Field(default=30.0, gt=0, le=86_400)
    """Every this many seconds in line, a waiting request competes one priority class higher
    (low → normal → high), so lower classes are delayed but never starved."""

    replicas: int = Field(default=1, ge=1)
    """Identical instances of the model; requests go to the least busy one."""

    replica_max: int = Field(default=4, ge=1)
    """Most replicas the admin API may scale the model to."""

    autoload: bool = True
    """Load on the first request. Off: requests get 409 until an admin loads the model."""

    keep_alive: Duration = -1.0
    """Unload after this long idle (seconds or text like `5m`); 0: after each request;
    -1: never. A request's `keep_alive` field overrides it, as in Ollama."""

    pinned: bool = False
    """Never unloaded to make room for another model."""

    memory_bytes: ByteSize | None = None
    """Memory the model needs (e.g. `600MB`); default: estimated from its files."""

    retry_cooldown_s: float = Field(default=30.0, ge=0)
    """After a failed load, requests get the error at once for this long, then a load is retried."""

    restart_backoff_s: float = Field(default=1.0, ge=0)
    """After an engine process crashes, the next request restarts it after this long,
    doubled for each crash in a row (a served request ends the row)."""

    max_restarts: int = Field(default=5, ge=0)
    """Crashes in a row after which modelpool stops restarting the engine and says so;
    `modelpool load` (an explicit load) tries again."""

    allow_remote: bool = False
    """For remote backends (`openai_remote`): serve requests that do not say
    `allow_remote: true`. Off, such requests get 403 `remote_not_allowed`."""

    warmup: bool = True
    """Run one tiny request right after loading, so the first user request is not the slow one."""

    batch: BatchConfig = Field(default_factory=BatchConfig)
    """Micro-batching of batchable requests (embeddings, rerank pairs)."""

    embedding_cache_size: int = Field(default=0, ge=0)
    """Embeddings kept per model, keyed by the exact input (LRU); 0: no cache."""

    install_hint: str | None = None
    """What to run when the source is missing (shown by `modelpool models` and in errors)."""

    enable_thinking: bool | None = None
    """The chat template's `enable_thinking` for a request that does not set it (`thinking:
    "default"` on /v1/responses, no `chat_template_kwargs.enable_thinking` on chat
    completions, no `thinking` on /v1/messages); `false` keeps a thinking model (Qwen3) to
    plain answers unless asked. Unset: the template's own default. llm-pool's per-model
    setting of the same name; shown as `capabilities.thinking_default`. Chat models only."""

    reasoning_parser: Literal["think", "think_open"] | None = None
    """Return <think>…</think> text as `reasoning_content`: `think` when the model opens the
    tag, `think_open` when the chat template already did."""

    tool_parser: Literal["hermes", "llama3_json", "mistral", "generic"] | None = None
    """How the model writes tool calls (local backends). Default: detected from the chat
    template (`<tool_call>`: hermes, `[TOOL_CALLS]`: mistral, `<|python_tag|>`:
    llama3_json); a template that takes no `tools` gets the generic JSON format."""

    constrained_auto_tools: bool = True
    """With `tool_choice: auto`, hold the reply to plain text or well-formed calls (local
    backends). Off: the model writes freely, and a call it botches comes back as text."""

    sampling: SamplingDefaults = Field(default_factory=SamplingDefaults)
    """Sampling values used when a request leaves them out."""

    options: dict[str, Any] = Field(default_factory=dict)
    """Backend options, validated by the backend (see the backend reference)."""

    adapters: dict[str, AdapterConfig] = Field(default_factory=dict, max_length=256)
    """LoRA adapters of this model: name → adapter (or just its source). A request picks one with
    `model: "<id>:<name>"` or the `adapter` field; docs/lora.md. Only on backends whose
    `capabilities.adapters` is true."""

    max_adapters: int = Field(default=8, ge=1, le=64)
    """Adapters held in memory at once per replica; loading one more unloads the least
    recently used adapter that no running request uses."""

    ray: RayModelConfig | None = None
    """Ray mode only (`modelpool serve --ray`): this model's Ray Serve deployment (replicas,
    autoscaling, resources) or the multiplexed group it joins. Ignored by the single-process
    server."""

    @field_validator("adapters", mode="before")
    @classmethod
    def _adapter_shorthand(cls, value: Any) -> Any:
        """`name: path` is short for `name: {source: path}`."""
        if isinstance(value, dict):
            return {name: {"source": a} if isinstance(a, str) else a for name, a in value.items()}
        return value

    @field_validator("adapters")
    @classmethod
    def _adapter_names(cls, value: dict[str, AdapterConfig]) -> dict[str, AdapterConfig]:
        for name in value:
            if not re.fullmatch(ADAPTER_NAME_PATTERN, name):
                raise ValueError(f"adapter name '{name}': use letters, digits, '.', '_' and '-' (at most 64, no ':')")
        return value


class UsageStoreConfig(_Strict):
    """Per-key usage and rate-limit budgets kept in a local SQLite file, so a restart loses
    neither what each key used nor how much of its budget is left."""

    enabled: bool = True
    """Keep usage and budgets on disk (on by default). Off: they live in memory and start
    afresh with each start. One server per file: a second server finding the file locked by
    another keeps its usage in memory and warns, rather than sharing the other's budgets."""

    path: Path | None = None
    """The SQLite file (default: `usage.sqlite` under `work_dir`)."""

    flush_interval_s: float = Field(default=1.0, ge=0.05, le=60.0)
    """How often what requests used is written, in one transaction off the event loop
    (a request never waits on the disk). A crash loses at most this long of usage."""


class BatchApiConfig(_Strict):
    """OpenAI's Files and Batches APIs (`/v1/files`, `/v1/batches`). Not the micro-batching
    of `batching` (requests grouped into one engine call): this runs uploaded JSONL files of
    requests in the background."""

    enabled: bool = True
    """Serve `/v1/files` and `/v1/batches`."""

    dir: Path | None = None
    """Where the files and the batches' SQLite database live (default: `batches` under
    `work_dir`). Ids are random; a client never names a path."""

    max_file_bytes: int = Field(default=100 * 1024 * 1024, ge=1, le=200 * 1000 * 1000)
    """Largest upload to `/v1/files` (OpenAI's limit is 200 MB); bigger gets 413."""

    max_lines: int = Field(default=50_000, ge=1, le=50_000)
    """Most requests in one batch input file (OpenAI's limit)."""

    max_line_bytes: int = Field(default=1024 * 1024, ge=64, le=64 * 1024 * 1024)
    """Largest line of a batch input file (one request's body); a longer line is a 400 naming it."""

    key_storage_bytes: int = Field(default=1024 * 1024 * 1024, ge=1)
    """Bytes of files (uploads and batch outputs) one key may keep, counting its running
    batches' finished lines; past it an upload gets 413 and a running batch stops (`failed`)."""

    key_files: int = Field(default=10_000, ge=1, le=1_000_000)
    """Files one key may keep."""

    key_batches: int = Field(default=100, ge=1, le=10_000)
    """Unfinished batches one key may have at once; one more is a 400 `too_many_batches`.
    A batch waiting for its turn holds no lines in memory (they are read as they run)."""

    key_batches_kept: int = Field(default=1000, ge=1, le=100_000)
    """Ended batches one key keeps to list and retrieve; making one more forgets its oldest
    ended batch (its output and error files stay, in the key's quota)."""

    concurrency: int = Field(default=1, ge=1, le=16)
    """Requests of all batches together that run at once. Batch work goes to the pool as
    low-priority requests, so it fills idle capacity instead of competing with live callers."""


class Config(_Strict):
    server: ServerConfig = Field(default_factory=ServerConfig)
    """HTTP server settings."""

    starter_models: bool = True
    """Include the built-in starter catalog (models shipped in PyPI packages) under `models`."""

    models: dict[str, ModelConfig] = Field(default_factory=dict)
    """The catalog: model id → model settings."""

    enabled_models: list[str] | None = None
    """Ids or aliases to serve (default: every model in the catalog). `--models` sets it."""

    pool: PoolConfig = Field(default_factory=PoolConfig)
    """Limits of the pool as a whole."""

    auth: AuthConfig = Field(default_factory=AuthConfig)
    """API keys and their scopes."""

    batch_api: BatchApiConfig = Field(default_factory=BatchApiConfig)
    """OpenAI's Files and Batches APIs: JSONL files of requests run in the background."""

    usage_store: UsageStoreConfig = Field(default_factory=UsageStoreConfig)
    """Per-key usage and rate-limit budgets in SQLite, so they survive a restart."""

    hf_cache_dir: Path | None = None
    """Hugging Face cache for `hf:` sources (default: huggingface_hub's own)."""

    offline: bool = False
    """Never download: `hf:` sources must already be in the cache."""

    work_dir: Path | None = None
    """Where modelpool keeps files it makes, such as GGUF models converted for transformers
    (default: ~/.cache/modelpool)."""

    ray: RaySettings = Field(default_factory=RaySettings)
    """Ray mode only (`modelpool serve --ray`): the cluster, the ingress and multiplexed groups."""

    defaults: ServerDefaults = Field(default_factory=ServerDefaults)
    """Server-wide defaults: sampling for every model, and the model a body without `model` uses."""

    state_dir: Path | None = None
    """Where modelpool keeps the registry of processes that outlive it (persistent engines,
    stack services) and their logs (default: $XDG_STATE_HOME/modelpool, i.e.
    ~/.local/state/modelpool)."""

    @model_validator(mode="before")
    @classmethod
    def _ids_from_keys(cls, data: Any) -> Any:
        """Each entry under `models:` takes its id from its key, so the file never repeats it."""
        if isinstance(data, dict) and isinstance(data.get("models"), dict):
            models = {}
            for key, entry in data["models"].items():
                if isinstance(entry, dict):
                    entry = {**entry, "id": entry.get("id", key)}
                models[key] = entry
            data = {**data, "models": models}
        return data

    @model_validator(mode="after")
    def _names_are_unique(self) -> Config:
        for model in self.models.values():
            if model.replicas > model.replica_max:
                raise ValueError(f"models.{model.id}: replicas ({model.replicas}) exceeds replica_max")
        owner: dict[str, str] = {}
        for key, model in self.models.items():
            if model.id != key:
                raise ValueError(f"models.{key}: id '{model.id}' differs from its key")
            for name in [model.id, *model.aliases, *(f"{model.id}:{a}" for a in model.adapters)]:
                if name in owner and owner[name] != model.id:
                    raise ValueError(f"name '{name}' is used by both '{owner[name]}' and '{model.id}'")
                owner[name] = model.id
        for name in self.enabled_models or []:
            if name not in owner:
                raise ValueError(f"enabled_models: unknown model '{name}' (known: {', '.join(sorted(owner))})")
        return self

    @model_validator(mode="after")
    def _server_defaults_hold(self) -> Config:
        """Each model takes the server-wide sampling defaults its own `sampling` leaves unset
        (so the pool has one set per model); each default model is served and may do its task."""
        server = self.defaults.sampling.model_dump(exclude_none=True)
        for model in self.models.values():
            own = model.sampling.model_dump(exclude_none=True)
            model.sampling = SamplingDefaults(**{**server, **own})
        served = {name: m for m in self.served_models() for name in (m.id, *m.aliases)}
        for task, name in self.defaults.models.items():
            chosen = served.get(name)
            if chosen is None:
                raise ValueError(f"defaults.models.{task.value}: '{name}' is not a served model")
            if chosen.tasks is not None and task not in chosen.tasks:
                raise ValueError(f"defaults.models.{task.value}: model '{chosen.id}' does not do {task.value}")
        return self

    @model_validator(mode="after")
    def _one_upload_fits_the_audio_budget(self) -> Config:
        if self.server.audio_budget_seconds < self.server.max_audio_seconds:
            raise ValueError("server.audio_budget_seconds must be at least server.max_audio_seconds")
        return self

    @model_validator(mode="after")
    def _cors_is_narrow(self) -> Config:
        server = self.server
        if "*" not in server.cors_origins:
            return self
        if server.cors_allow_credentials:
            raise ValueError("server.cors_origins '*' cannot go with cors_allow_credentials: list the origins")
        if self.auth.keys and not server.cors_allow_any_with_keys:
            raise ValueError(
                "server.cors_origins '*' lets every web page call this server, and API keys are configured: "
                "list the origins that may call it, or set server.cors_allow_any_with_keys: true"
            )
        return self

    def served_models(self) -> list[ModelConfig]:
        """The catalog entries this server serves, in catalog order."""
        if self.enabled_models is None:
            return list(self.models.values())
        wanted = set(self.enabled_models)
        return [m for m in self.models.values() if wanted & {m.id, *m.aliases}]
