"""The client SDK: speaks HTTP to modelpool (or any OpenAI-compatible server); imports
nothing of modelpool outside `modelpool.client`, so it could ship as its own package.

    config = load_models_config("models.yaml")
    async with make_llm(config, "agent_llm") as llm:
        await llm.wait_ready(60)
        reply = await llm.chat([ChatMessage.user("Hi")], max_tokens=40, enable_thinking=False)
        print(reply.content, reply.reasoning, reply.usage)

Tools and structured output (the OpenAI wire format; tools.py, results.py):

    reply = await llm.chat(history, tools=[get_weather])   # a function, a pydantic class or a dict
    for call in reply.tool_calls:                          # ToolCall(id, name, arguments); .args
        ...
    city = (await llm.chat(history, response_format=City)).parsed   # a validated City

`modelpool.client.sync` has the same factories returning blocking clients. The typed
exceptions are drawn in `modelpool.client.errors`; presets in `modelpool.client.presets`.
"""

from modelpool.client.admin import AdminClient
from modelpool.client.audio import STTClient, TTSClient
from modelpool.client.backend import load_worker_models, models_file_of
from modelpool.client.config import Endpoint, ModelsConfig, load_models_config, parse_models_config
from modelpool.client.embedder import EmbedderClient
from modelpool.client.errors import (
    AuthenticationError,
    BadRequest,
    ClientError,
    ConfigError,
    ConnectionFailed,
    ContextLengthExceeded,
    InvalidRequest,
    ModelLoadError,
    ModelNotFound,
    ModelNotLoaded,
    ModelNotReady,
    NotFound,
    NotReady,
    Overloaded,
    PermissionDenied,
    ReadyTimeout,
    RemoteNotAllowed,
    RequestTooLarge,
    ServerError,
    StructuredOutputError,
    ToolArgumentsError,
    UpstreamUnavailable,
)
from modelpool.client.factory import make_embedder, make_llm, make_reranker, make_stt, make_tts, make_vlm
from modelpool.client.live import LiveDelta, LiveUtterance
from modelpool.client.llm import ChatOptions, LLMClient, VLMClient
from modelpool.client.messages import ChatMessage
from modelpool.client.presets import PRESETS, Capabilities, Preset, Thinking
from modelpool.client.reranker import RerankerClient
from modelpool.client.results import (
    ChatDelta,
    ChatResult,
    Completion,
    Embeddings,
    ParsedChat,
    Ranked,
    Reranking,
    Speech,
    ToolCall,
    ToolCallAccumulator,
    ToolCallDelta,
    Transcript,
    TranscriptSegment,
    Usage,
    Voice,
    parse_structured,
)
from modelpool.client.tools import ResponseFormat, ToolChoice, ToolLike, tool_schema

__all__ = [
    "PRESETS",
    "AdminClient",
    "AuthenticationError",
    "BadRequest",
    "Capabilities",
    "ChatDelta",
    "ChatMessage",
    "ChatOptions",
    "ChatResult",
    "ClientError",
    "Completion",
    "ConfigError",
    "ConnectionFailed",
    "ContextLengthExceeded",
    "EmbedderClient",
    "Embeddings",
    "Endpoint",
    "InvalidRequest",
    "LLMClient",
    "LiveDelta",
    "LiveUtterance",
    "ModelLoadError",
    "ModelNotFound",
    "ModelNotLoaded",
    "ModelNotReady",
    "ModelsConfig",
    "NotFound",
    "NotReady",
    "Overloaded",
    "ParsedChat",
    "PermissionDenied",
    "Preset",
    "Ranked",
    "ReadyTimeout",
    "RemoteNotAllowed",
    "RequestTooLarge",
    "RerankerClient",
    "Reranking",
    "ResponseFormat",
    "STTClient",
    "ServerError",
    "Speech",
    "StructuredOutputError",
    "TTSClient",
    "Thinking",
    "ToolArgumentsError",
    "ToolCall",
    "ToolCallAccumulator",
    "ToolCallDelta",
    "ToolChoice",
    "ToolLike",
    "Transcript",
    "TranscriptSegment",
    "UpstreamUnavailable",
    "Usage",
    "VLMClient",
    "Voice",
    "load_models_config",
    "load_worker_models",
    "make_embedder",
    "make_llm",
    "make_reranker",
    "make_stt",
    "make_tts",
    "make_vlm",
    "models_file_of",
    "parse_models_config",
    "parse_structured",
    "tool_schema",
]
