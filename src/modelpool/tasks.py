"""The kinds of work a model can do. Config, backends and the API all speak this enum; each
has its Protocol in `backends.base.TASK_PROTOCOLS`, and none is declared before something serves it."""

from enum import Enum


class Task(str, Enum):
    CHAT = "chat"
    COMPLETION = "completion"
    EMBEDDING = "embedding"
    TRANSCRIPTION = "transcription"
    SPEECH = "speech"
    SCORING = "scoring"
    RERANK = "rerank"
    """Relevance of text pairs (a query and its documents): cross-encoders. Embedding models
    answer rerank requests too, by the cosine of their vectors."""
