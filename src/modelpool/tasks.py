"""The kinds of work a model can do. Config, backends and the API all speak this enum."""

from enum import Enum


class Task(str, Enum):
    CHAT = "chat"
    COMPLETION = "completion"
    EMBEDDING = "embedding"
    RERANK = "rerank"
    TRANSCRIPTION = "transcription"
    SPEECH = "speech"
    SCORING = "scoring"
