"""OpenAIRemoteBackend: a model served by any OpenAI-compatible server elsewhere (another
machine, a hosted API). Requests reach it only through the `allow_remote` gate."""

from __future__ import annotations

from dataclasses import replace

from pydantic import BaseModel, ConfigDict, Field

from modelpool.backends.base import DeclaredBackend, MemoryEstimate
from modelpool.backends.context import BackendContext
from modelpool.backends.remote.client import RetryPolicy, UpstreamClient, UpstreamTimeouts
from modelpool.backends.remote.forwarding import TRANSCRIPTION_RATE, ForwardingBackend
from modelpool.capabilities import Capabilities, Locality, Modality
from modelpool.config.environment import secret
from modelpool.config.schema import ModelConfig
from modelpool.errors import ModelLoadFailed, ModelpoolError
from modelpool.tasks import Task


class RemoteOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    base_url: str = Field(pattern=r"^https?://")
    """The upstream's OpenAI base URL, with its version path (`https://api.openai.com/v1`)."""
    api_key_env: str | None = None
    """Environment variable holding the API key, sent as a bearer token (never logged)."""
    upstream_model: str | None = None
    """The model's name at the upstream (default: the model id)."""
    timeout_s: float = Field(default=600.0, gt=0)
    """Longest wait for the upstream's next bytes."""
    connect_timeout_s: float = Field(default=10.0, gt=0)
    """Longest wait to connect."""
    retries: int = Field(default=2, ge=0)
    """Further tries on connection errors and 5xx answers (never on 4xx, never mid-stream)."""
    retry_backoff_s: float = Field(default=0.5, ge=0)
    """Wait before the first retry; doubled before each next one."""
    health_check: bool = True
    """Probe `health_path` when the model loads (and on health checks); off for upstreams
    without one."""
    health_path: str = "models"
    """Path under `base_url` that answers 200 when the upstream is up."""
    max_concurrency: int = Field(default=16, ge=1)
    """Requests forwarded at once; more wait in modelpool's queue."""
    context_length: int | None = Field(default=None, ge=1)
    """The upstream model's context, for `/v1/models` (requests are checked upstream)."""
    vision: bool = False
    """The upstream model reads images: image parts are forwarded (data URIs as they are)."""
    video: bool = False
    """The upstream model reads video (vLLM with a Qwen-VL model, a modelpool with a video
    model): `video_url` parts are forwarded as they came (data URIs; local files and, unless
    the upstream fetches URLs, remote ones read and sent as data URIs)."""
    upstream_fetches_images: bool = False
    """Send `http(s)://` image URLs to the upstream as they are, for it to fetch; otherwise
    modelpool fetches them (under `server.allow_remote_images` and its guard) and forwards
    the bytes as a data URI."""
    max_images: int | None = Field(default=8, ge=1)
    """Most images a request may carry (set the upstream's limit, when it has one; None:
    only `server.max_images_per_request`)."""
    speech_sample_rate: int = Field(default=24_000, ge=8000)
    """Sample rate of the upstream's `pcm` speech (OpenAI's: 24000; a modelpool with a
    Piper voice: 22050)."""


class OpenAIRemoteBackend(ForwardingBackend, DeclaredBackend):
    Options = RemoteOptions
    capabilities = Capabilities(
        tasks=frozenset({Task.CHAT, Task.COMPLETION, Task.EMBEDDING, Task.TRANSCRIPTION, Task.SPEECH}),
        default_tasks=frozenset({Task.CHAT, Task.COMPLETION}),
        modalities=frozenset({Modality.TEXT, Modality.AUDIO}),
        locality=Locality.REMOTE,
        needs_source=False,
        audio_input_rate=TRANSCRIPTION_RATE,
        tools=True,  # forwarded as they are: the upstream renders, constrains and parses them
        structured_output=True,
        thinking_in_template=True,  # chat_template_kwargs forwarded; the upstream splits reasoning_content
    )
    """What the upstream can do is declared with `tasks:`; unsaid, a chat model."""
    overridable = frozenset({"timeout_s", "retries", "max_concurrency"})

    @classmethod
    def capabilities_for(cls, options: RemoteOptions) -> Capabilities:
        modalities = cls.capabilities.modalities | ({Modality.IMAGE} if options.vision else set())
        modalities |= {Modality.VIDEO} if options.video else set()
        return replace(cls.capabilities, engine_concurrency=options.max_concurrency,
                       context_length=options.context_length, modalities=frozenset(modalities),
                       max_images=options.max_images, image_urls_upstream=options.upstream_fetches_images)  # fmt: skip

    def __init__(self, model: ModelConfig, options: RemoteOptions, context: BackendContext) -> None:
        self.model = model
        self.options = options
        self.upstream_model = options.upstream_model or model.id
        self.speech_sample_rate = options.speech_sample_rate

    async def estimate_memory(self) -> MemoryEstimate:
        return MemoryEstimate(0)  # it runs elsewhere

    async def start(self) -> None:
        options = self.options
        api_key = None
        if options.api_key_env:
            api_key = secret(options.api_key_env)
            if not api_key:
                raise ModelLoadFailed(
                    f"model '{self.model.id}': the environment variable {options.api_key_env} "
                    "(api_key_env) is not set"
                )
        self.upstream = UpstreamClient(
            self.model.id,
            options.base_url,
            api_key=api_key,
            retry=RetryPolicy(options.retries, options.retry_backoff_s),
            timeouts=UpstreamTimeouts(options.connect_timeout_s, options.timeout_s),
            max_connections=max(64, options.max_concurrency * 2),
        )
        await self.upstream.open()
        if options.health_check:
            await self.check_health()

    async def warmup(self) -> None:
        return None  # a warm-up request to a hosted API would cost money and warm nothing here

    async def stop(self) -> None:
        if self.upstream is not None:
            await self.upstream.close()
            self.upstream = None

    async def check_health(self) -> None:
        if not self.options.health_check:
            return
        try:
            await self.client().probe(self.options.health_path)
        except ModelpoolError as exc:
            raise ModelLoadFailed(f"model '{self.model.id}': upstream health check failed: {exc.message}") from None
