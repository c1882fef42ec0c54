"""The published OpenAPI against the server that publishes it: schemathesis (its CLI, a real
subprocess) with ALL its checks, against a real `modelpool serve` subprocess serving the
starter chat, embedding, speech and transcription models with API keys configured, over every route of the schema
(the inference routes, the listings, health, metrics and the admin routes, with a key that
may use them). It must find 0 failures.

Bounded for CI: a fixed seed and example count (`MAX_EXAMPLES` per operation per phase);
`MODELPOOL_SCHEMATHESIS_SECONDS=150` runs it wide instead (fuzzing repeats until the time
is spent, as issue 31's run did). The run's configuration is written from the schema
itself: a body the schema admits may be refused with a 400 only on a route whose 400 lists
`x-unstated-rules` (a rule across fields or one the served models set, which no JSON
Schema can state: `wire/contract.py`), and 413 (a body over `server.max_body_bytes`, whose
size no schema states either) is a refusal schemathesis may see for any body.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis

from tests.audio_files import wav_bytes
from tests.conftest import CHAT_MODEL, EMBED_MODEL, HF_MODEL, STT_MODEL, TTS_MODEL
from tests.processes import Server, modelpool_serve

pytestmark = pytest.mark.e2e  # a real server with real models: `-m "not e2e"` leaves it out

KEY = "schemathesis-" + "k" * 24
MAX_EXAMPLES = 12
SEED = 31
WIDE_S = int(os.environ.get("MODELPOOL_SCHEMATHESIS_SECONDS", "0"))
# schemathesis's own defaults (config/_checks.py), plus 413: no schema states a body's size.
ACCEPTED = ["2xx", "3xx", "401", "403", "404", "409", "413", "429", "5xx"]
REJECTED = ["400", "401", "403", "404", "405", "406", "409", "413", "415", "422", "428", "429", "5xx"]
CONFIG = """
starter_models: true
server:
  max_body_bytes: 1000000
auth:
  keys:
    - name: contract
      key_env: MODELPOOL_CONTRACT_KEY
      scopes: [inference, admin]
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    folder = tmp_path_factory.mktemp("contract")
    (folder / "modelpool.yaml").write_text(CONFIG)
    # Two models that generate and score (the transformers one loads only if named, and no
    # generated body names it): a body without `model` is then the documented 400 naming
    # the candidates, never a random body run on a model for as long as its max_tokens.
    served = ",".join((CHAT_MODEL, EMBED_MODEL, HF_MODEL, TTS_MODEL, STT_MODEL))
    args = ("--config", str(folder / "modelpool.yaml"), "--models", served)
    env = {"MODELPOOL_CONTRACT_KEY": KEY, "MODELPOOL_BATCH_API__DIR": str(folder / "batches")}  # its uploads stay here
    with modelpool_serve(folder / "server.log", *args, env=env) as running:
        yield running


def run_config(schema: dict[str, Any]) -> str:
    """schemathesis.toml: the key (from the environment), the expected statuses, and a 400
    admitted for schema-valid bodies only where the operation's 400 lists unstated rules."""
    lines = ['headers = { Authorization = "Bearer ${MODELPOOL_CONTRACT_KEY}" }', "",
             "[checks.positive_data_acceptance]", f"expected-statuses = {ACCEPTED}", "",
             "[checks.negative_data_rejection]", f"expected-statuses = {REJECTED}", ""]  # fmt: skip
    for path, item in schema["paths"].items():
        for method, operation in item.items():
            if "x-unstated-rules" in operation.get("responses", {}).get("400", {}):
                lines += ["[[operations]]", f'include-path = "{path}"', f'include-method = "{method.upper()}"',
                          f"checks.positive_data_acceptance.expected-statuses = {[*ACCEPTED, '400']}", ""]  # fmt: skip
    return "\n".join(lines).replace("'", '"')


def test_schemathesis_finds_no_failures_with_all_checks(server: Server, tmp_path: Path) -> None:
    schema = httpx.get(f"{server.url}/openapi.json", timeout=10).json()
    (tmp_path / "schemathesis.toml").write_text(run_config(schema))
    bound = ["--max-time", str(WIDE_S)] if WIDE_S else ["--max-examples", str(MAX_EXAMPLES)]
    argv = [sys.executable, "-m", "schemathesis.cli", "--config-file", str(tmp_path / "schemathesis.toml"),
            "run", f"{server.url}/openapi.json", "--checks", "all",
            "--seed", str(SEED), "--workers", "2", "--request-timeout", "60", "--no-color", *bound]  # fmt: skip
    env = {**os.environ, "MODELPOOL_CONTRACT_KEY": KEY, "NO_COLOR": "1"}
    # cwd: the run's cache (.schemathesis/) and config stay in the test's folder.
    done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    output = done.stdout + done.stderr
    (tmp_path / "schemathesis.txt").write_text(output)
    print(output[output.find("=== SUMMARY"):])  # -s shows the cases generated and the warnings
    generated = re.search(r"(\d+) generated", output)
    assert generated is not None and int(generated.group(1)) > 500, output[-3000:]
    assert done.returncode == 0, f"the whole output: {tmp_path / 'schemathesis.txt'}\n{output[:20000]}"


HI = [{"role": "user", "content": "Say hi"}]
# One ordinary request per route, each answered by a real model: the success side of the
# contract (status, content type, JSON or each SSE event against the published schema),
# which the generated requests above rarely reach (they name models that do not exist).
DOCUMENTED: list[tuple[str, str, dict[str, Any]]] = [
    ("POST", "/v1/chat/completions", {"model": CHAT_MODEL, "messages": HI, "max_tokens": 4}),
    ("POST", "/v1/chat/completions", {"model": CHAT_MODEL, "messages": HI, "max_tokens": 4, "stream": True}),
    ("POST", "/v1/completions", {"model": CHAT_MODEL, "prompt": "Hello", "max_tokens": 4}),
    ("POST", "/v1/completions", {"model": CHAT_MODEL, "prompt": "Hello", "max_tokens": 4, "stream": True}),
    ("POST", "/v1/responses", {"model": CHAT_MODEL, "input": "Say hi", "max_output_tokens": 4}),
    ("POST", "/v1/responses", {"model": CHAT_MODEL, "input": "Say hi", "max_output_tokens": 4, "stream": True}),
    ("POST", "/v1/messages", {"model": CHAT_MODEL, "messages": HI, "max_tokens": 4}),
    ("POST", "/v1/messages", {"model": CHAT_MODEL, "messages": HI, "max_tokens": 4, "stream": True}),
    ("POST", "/v1/messages/count_tokens", {"model": CHAT_MODEL, "messages": HI}),
    ("POST", "/v1/embeddings", {"model": EMBED_MODEL, "input": "hello"}),
    ("POST", "/embedding", {"content": "hello"}),
    ("POST", "/v1/rerank", {"model": EMBED_MODEL, "query": "a cat", "documents": ["a cat sat", "a car"]}),
    ("POST", "/v1/score", {"model": EMBED_MODEL, "text_1": "a cat", "text_2": ["a cat sat", "a car"]}),
    ("POST", "/tokenize", {"model": CHAT_MODEL, "prompt": "hello"}),
    ("POST", "/detokenize", {"model": CHAT_MODEL, "tokens": [28120]}),
    ("POST", "/generate", {"model": CHAT_MODEL, "prompts": ["Hi"], "max_tokens": 2}),
    ("POST", "/generate_stream", {"model": CHAT_MODEL, "prompts": ["Hi"], "max_tokens": 2}),
    ("POST", "/loglikelihood", {"model": CHAT_MODEL, "prompts": ["The sky is"], "continuations": [" blue"]}),
    ("POST", "/mcp", {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}),
    ("POST", "/v1/audio/speech", {"model": TTS_MODEL, "input": "Hi.", "response_format": "wav"}),
    ("POST", "/v1/audio/speech", {"model": TTS_MODEL, "input": "Hi.", "response_format": "mp3"}),
    ("POST", "/v1/audio/speech", {"model": TTS_MODEL, "input": "Hi.", "stream_format": "sse"}),
]
READS = ["/v1/models", "/healthz", "/health", "/readyz", "/metrics", "/metrics/history", "/v1/audio/voices",
         "/v1/admin/models", "/v1/admin/memory", "/v1/admin/usage", "/v1/admin/gpu-memory"]  # fmt: skip
MODEL_READS = ["/v1/models/{model_id}", "/v1/admin/models/{model_id}/status"]


def test_ordinary_requests_get_what_the_schema_says(server: Server) -> None:
    """schemathesis's checks on one real answer per route (ST108 caught SSE events that
    the schema described as bare strings)."""
    schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json")
    auth = {"Authorization": f"Bearer {KEY}", "Accept": "application/json, text/event-stream"}
    cases = [schema[path][method].Case(body=body) for method, path, body in DOCUMENTED]
    cases += [schema[path]["GET"].Case() for path in READS]
    cases += [schema[path]["GET"].Case(path_parameters={"model_id": CHAT_MODEL}) for path in MODEL_READS]
    transcribe = schema["/v1/audio/transcriptions"]["POST"]
    for kind in ("json", "text", "vtt", "srt"):  # JSON, then the text formats, each its own content type
        form: Any = {"file": wav_bytes(seconds=1.0), "model": STT_MODEL, "response_format": kind}
        cases.append(transcribe.Case(body=form, media_type="multipart/form-data"))
    for case in cases:
        method, path = case.method, case.path
        response = case.call_and_validate(headers=auth, timeout=120)
        assert response.status_code < 300, f"{method} {path}: {response.status_code} {response.text[:300]}"
