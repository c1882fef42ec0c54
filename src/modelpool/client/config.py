"""models.yaml: which endpoint serves each role of an application.

    agent_llm: {kind: preset:qwen3, base_url: http://localhost:8000, model_name: qwen3-8b}
    stt:       {kind: preset:whisper, service: speech}      # a running `modelpool up` service
    search:    {kind: openai_compat, base_url: https://api.example.com/v1, model_name: emb-3,
                api_key_env: EXAMPLE_API_KEY, health_check: false}

Everything that can be checked without the network is checked at load, with the role and
field named: unknown preset, missing base_url, a model name nobody gave, an unset key
variable (named; the key itself is never printed). A `service:` is looked up in the
running-services registry only when a client is made, since services come and go.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from modelpool.client.credentials import layered_environ
from modelpool.client.errors import ConfigError
from modelpool.client.presets import STANDARD_REASONING_FIELDS, Capabilities, Preset, Role, Thinking, find_preset
from modelpool.client.profile import flatten_profile
from modelpool.client.services import AmbiguousService, resolve, running_services

DEFAULT_TIMEOUT_S = 600.0


class CapabilitiesSpec(BaseModel):
    """Overrides of the preset's capabilities; unset fields keep the preset's."""

    model_config = ConfigDict(extra="forbid")
    vision: bool | None = None
    streaming: bool | None = None
    stream_usage: bool | None = None
    verbose_json: bool | None = None
    tool_calls: bool | None = None
    reasoning: bool | None = None
    video: bool | None = None


CATEGORIES: dict[str, Role] = {
    "llm": Role.LLM,
    "vlm": Role.VLM,
    "embedding": Role.EMBEDDER,
    "embedder": Role.EMBEDDER,
    "reranker": Role.RERANKER,
    "stt": Role.STT,
    "tts": Role.TTS,
}
"""`category:` as the agent sample's models.yaml writes it → the client kind it is for."""


class EndpointSpec(BaseModel):
    """One role as models.yaml writes it."""

    model_config = ConfigDict(extra="forbid")
    kind: str
    """`preset:NAME` (see presets.py) or `openai_compat` (no quirks; needs model_name)."""
    category: Literal["llm", "vlm", "embedding", "embedder", "reranker", "stt", "tts"] | None = None
    """Which make_* fits the role (the agent sample's key): with `openai_compat` it says
    what the endpoint is; with a preset it must agree with the preset's."""
    base_url: str | None = None
    """The server's root (`http://host:8000`; a trailing `/v1` is accepted and dropped)."""
    service: str | None = None
    """Instead of base_url: a running service in the registry (`modelpool up`), by name,
    `stack/name` or id."""
    model_name: str | None = None
    """The model name to send; overrides the preset's."""
    api_key_env: str | None = None
    """Environment variable holding the bearer key (keys never go in the file)."""
    health_check: bool = True
    """False: wait_ready returns at once (servers with no probe-able route, hosted APIs)."""
    health_path: str | None = None
    """Probe only this path instead of the preset's chain (/readyz → /health → /v1/models)."""
    timeout_s: float | None = Field(default=None, gt=0, validation_alias=AliasChoices("timeout_s", "timeout"))
    """Per-request read timeout (`timeout:` as the agent sample writes it; default: the
    preset's, else 600 s: CPU generation and first loads can be slow)."""
    connect_timeout_s: float = Field(default=10.0, gt=0)
    capabilities: CapabilitiesSpec = Field(default_factory=CapabilitiesSpec)
    reasoning_fields: list[str] | None = None
    """Where the server puts reasoning text; overrides the preset's."""
    reasoning_field: str | None = None
    """The agent sample's singular spelling: this field first, then the usual ones."""
    thinking: Thinking | None = None
    """How enable_thinking is sent; overrides the preset's."""
    voice: str | None = None
    """Default voice for text-to-speech."""
    language: str | None = None
    """Default language for speech-to-text."""
    extra_body: dict[str, Any] = Field(default_factory=dict)
    """Fields added to every request body (e.g. modelpool's `keep_alive`, `deterministic`)."""
    default_extras: dict[str, Any] = Field(default_factory=dict)
    """The agent sample's name for extra_body (replaces the preset's default_extras; the
    two are merged, extra_body last)."""

    @model_validator(mode="before")
    @classmethod
    def _no_inline_keys(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and "api_key" in data:
            raise ValueError("keys never go in the file: put the key in an environment variable and name it with "
                             "api_key_env")  # fmt: skip
        return data

    @field_validator("kind")
    @classmethod
    def _known_kind(cls, kind: str) -> str:
        find_preset(kind)
        return kind

    @model_validator(mode="after")
    def _one_address(self) -> EndpointSpec:
        if (self.base_url is None) == (self.service is None):
            raise ValueError("give exactly one of base_url or service")
        if self.reasoning_field is not None and self.reasoning_fields is not None:
            raise ValueError("give reasoning_field or reasoning_fields, not both")
        preset_role = find_preset(self.kind).role
        if self.category is not None and preset_role is not None and CATEGORIES[self.category] is not preset_role:
            raise ValueError(f"category {self.category} does not fit {self.kind}, a {preset_role.value} preset")
        if self.model_name is None and find_preset(self.kind).model_name is None:
            raise ValueError(f"model_name is required with kind {self.kind} (the served name depends on the server)")
        return self


@dataclass(frozen=True)
class Endpoint:
    """A role, resolved: the preset merged with the file's overrides, the key read."""

    role: str
    preset: Preset
    kind: Role | None
    """The client kind it is for: the `category`, else the preset's (None: any)."""
    model_name: str
    base_url: str | None
    service: str | None
    api_key: str | None = field(repr=False)
    api_key_env: str | None
    health_check: bool
    health_paths: tuple[str, ...]
    timeout_s: float
    connect_timeout_s: float
    capabilities: Capabilities
    reasoning_fields: tuple[str, ...]
    thinking: Thinking
    voice: str | None
    language: str | None
    extra_body: Mapping[str, Any]


@dataclass(frozen=True)
class ModelsConfig:
    endpoints: Mapping[str, Endpoint]
    state_dir: Path | None = None
    """Where the running-services registry lives (None: modelpool's default)."""
    source: str = "<models config>"

    def endpoint(self, role: str) -> Endpoint:
        try:
            return self.endpoints[role]
        except KeyError:
            known = ", ".join(sorted(self.endpoints)) or "none"
            raise ConfigError(f"{self.source}: unknown role {role!r} (roles: {known})") from None

    def base_url(self, role: str) -> str:
        """The role's server root, looking a `service:` up in the registry now."""
        endpoint = self.endpoint(role)
        if endpoint.base_url is not None:
            return endpoint.base_url
        assert endpoint.service is not None
        return _service_url(endpoint.service, self.state_dir, role)


def load_models_config(
    path: str | Path, *, environ: Mapping[str, str] | None = None, state_dir: Path | None = None
) -> ModelsConfig:
    """Read and check models.yaml (see the module docstring). Keys come from `environ` when
    given, else from the process environment, a `.env` beside the file and the saved
    credentials, in that order; the last two are read only for a key the environment
    lacks (credentials.py)."""
    path = Path(path)
    if environ is None:
        environ = layered_environ(path.parent)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read models config {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"models config {path} is not UTF-8 text") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from None
    return parse_models_config(data, environ=environ, state_dir=state_dir, source=str(path))


def parse_models_config(
    data: Any,
    *,
    environ: Mapping[str, str] | None = None,
    state_dir: Path | None = None,
    source: str = "<models config>",
) -> ModelsConfig:
    """The same checks as load_models_config, on an already parsed mapping (flat entries,
    or the agent sample's nested profile: profile.py)."""
    try:
        data = flatten_profile(data)
    except ValueError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    if not isinstance(data, Mapping) or not data:
        raise ConfigError(f"{source}: expected a mapping of role → endpoint, got {type(data).__name__}")
    env = os.environ if environ is None else environ
    endpoints = {str(role): _endpoint(str(role), raw, env, source) for role, raw in data.items()}
    return ModelsConfig(endpoints, state_dir, source)


def expect_role(endpoint: Endpoint, wanted: Role, also: tuple[Role, ...] = ()) -> None:
    """Refuse a make_* call whose preset is for another kind of client."""
    role = endpoint.kind
    if role is not None and role not in (wanted, *also):
        kind = role.value
        what = f"preset {endpoint.preset.name}" if endpoint.preset.role is not None else f"category {kind}"
        raise ConfigError(f"role {endpoint.role!r} uses {what}, a {kind} model: use make_{kind}")


def _endpoint(role: str, raw: Any, environ: Mapping[str, str], source: str) -> Endpoint:
    try:
        spec = EndpointSpec.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(f"{source}: role {role!r}: {_problems(exc)}") from None
    preset = find_preset(spec.kind)
    caps = {k: v for k, v in spec.capabilities.model_dump().items() if v is not None}
    kind = CATEGORIES[spec.category] if spec.category is not None else preset.role
    if kind is Role.VLM and preset.role is None:
        caps.setdefault("vision", True)  # `category: vlm` says the endpoint reads images
    return Endpoint(
        role=role,
        preset=preset,
        kind=kind,
        model_name=spec.model_name or preset.model_name or "",
        base_url=_root(spec.base_url) if spec.base_url is not None else None,
        service=spec.service,
        api_key=_read_key(spec.api_key_env, environ, role, source),
        api_key_env=spec.api_key_env,
        health_check=spec.health_check,
        health_paths=(spec.health_path,) if spec.health_path else preset.health_paths,
        timeout_s=spec.timeout_s or preset.timeout_s or DEFAULT_TIMEOUT_S,
        connect_timeout_s=spec.connect_timeout_s,
        capabilities=dataclasses.replace(preset.capabilities, **caps),
        reasoning_fields=_reasoning_fields(spec, preset),
        thinking=spec.thinking or preset.thinking,
        voice=spec.voice,
        language=spec.language,
        extra_body=_merged(spec.default_extras or preset.default_extras, spec.extra_body),
    )


def _reasoning_fields(spec: EndpointSpec, preset: Preset) -> tuple[str, ...]:
    if spec.reasoning_field is not None:
        return (spec.reasoning_field, *(f for f in STANDARD_REASONING_FIELDS if f != spec.reasoning_field))
    return tuple(spec.reasoning_fields or preset.reasoning_fields)


def _merged(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """`over` on `base`; mappings (chat_template_kwargs) merge one level deep."""
    merged = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            value = {**merged[key], **value}
        merged[key] = value
    return merged


def _problems(exc: ValidationError) -> str:
    """Each problem as `dotted.path: message`, joined: what a user can act on (the server's
    config loader words its problems the same way)."""
    return "; ".join(f"{_dotted(e['loc'])}: {str(e['msg']).removeprefix('Value error, ')}" for e in exc.errors())


def _dotted(loc: tuple[Any, ...]) -> str:
    return ".".join(str(part) for part in loc) or "(top level)"


def _read_key(name: str | None, environ: Mapping[str, str], role: str, source: str) -> str | None:
    if name is None:
        return None
    value = environ.get(name)
    if not value:
        raise ConfigError(
            f"{source}: role {role!r}: environment variable {name} (api_key_env) is not set: export it, put it "
            f"in a .env beside the file, or save it with `modelpool credentials set {name}`"
        )
    return value


def _root(url: str) -> str:
    """The server root: requests add /v1/..., probes add /readyz."""
    url = url.rstrip("/")
    return url.removesuffix("/v1")


def _service_url(name: str, state_dir: Path | None, role: str) -> str:
    """The URL of the one running service that `name` names — its id, its name or
    `stack/name`, as `modelpool logs/down` take them; never a guess between several."""
    try:
        record = resolve(running_services(state_dir), name)
    except AmbiguousService as exc:
        raise ConfigError(f"role {role!r}: {exc.message}") from None
    if record is None:
        raise ConfigError(f"role {role!r}: no running service named {name!r} (start it with `modelpool up`)")
    return _root(record.url)
