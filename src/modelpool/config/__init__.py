"""Typed settings, resolved once at start (see `loader` for the order of precedence)."""

from modelpool.config.loader import load_config
from modelpool.config.schema import Config, LogFormat, ModelConfig, ServerConfig

__all__ = ["Config", "LogFormat", "ModelConfig", "ServerConfig", "load_config"]
