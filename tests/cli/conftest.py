from __future__ import annotations

import logging
import os
from collections.abc import Iterator

import pytest
import yaml

from tests.conftest import CHAT_MODEL
from tests.processes import Server, modelpool_serve


@pytest.fixture(autouse=True)
def keep_logging_as_it_was() -> Iterator[None]:
    """`serve` configures logging onto the runner's captured stderr, which closes after the
    command; put the handlers back so later log lines do not go to a closed stream."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


APP_KEY = "sk-cli-tests-app-key"
ALIAS = "tiny-chat"
SERVER_ENVIRONMENT = {
    # Issue 29's cases, all set while the server starts: each used to stop it with
    # "Extra inputs are not permitted".
    "MODELPOOL_APP_KEY": APP_KEY,  # the README's key_env example
    "MODELPOOL_URL": "http://127.0.0.1:9",  # the CLI's and the SDK's own
    "MODELPOOL_API_KEY": "sk-meant-for-the-cli",
    "MODELPOOL_STACK": "/nowhere/stack.yaml",  # inherited by a stack's services
    "MODELPOOL_TEST_VLLM": "0",
    # A model id with dashes, reached by its folded name.
    "MODELPOOL_MODELS__SMOLLM2_135M_INSTRUCT__ALIASES": f"[{ALIAS}]",
}


@pytest.fixture(scope="session")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A real `modelpool serve` subprocess with the starter SmolLM2 GGUF, an API key read
    from MODELPOOL_APP_KEY (inference and admin), and the environment above."""
    folder = tmp_path_factory.mktemp("cli-server")
    config = folder / "modelpool.yaml"
    keys = [{"name": "app", "key_env": "MODELPOOL_APP_KEY", "scopes": ["inference", "admin"]}]
    config.write_text(yaml.safe_dump({"auth": {"keys": keys}}))
    args = ["--config", str(config), "--models", CHAT_MODEL, "--log-level", "debug", "--log-format", "json"]
    with modelpool_serve(folder / "server.log", *args, env=SERVER_ENVIRONMENT) as server:
        yield server


def cli_environment(server: Server) -> dict[str, str]:
    """The environment a user of the CLI has: where the server is, and its key."""
    clean = {name: value for name, value in os.environ.items() if not name.startswith("MODELPOOL_")}
    return {**clean, "MODELPOOL_URL": server.url, "MODELPOOL_API_KEY": APP_KEY}
