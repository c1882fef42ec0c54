"""modelpool: a pool of local and remote AI models behind one OpenAI-compatible API."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("modelpool")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0"
