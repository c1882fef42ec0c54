"""Issue 27, item 5: a web page cannot turn the browser against a loopback server. A page
whose DNS name is rebound to 127.0.0.1 still sends its own name as `Host` (421); a plain
HTML form posting a multipart upload carries its page's `Origin` (403). Clients that are
not browsers (no Origin, a loopback Host) and the workbench (its own origin) still work.

Served by uvicorn on a real loopback socket, so the headers are what a browser would send."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest

from modelpool.config import load_config
from modelpool.config.schema import ServerConfig
from modelpool.server.app import create_app
from modelpool.server.host_guard import KNOWN_HOSTS, BrowserRule, HostGuard
from tests.audio_files import wav_bytes
from tests.live_server import live_server

MODELS = {
    "echo": {"backend": "tests.fakes:EchoBackend", "preload": False},
    "stt": {"backend": "tests.fakes:SampleCountingTranscriber", "preload": False},
}
CHAT = {"model": "echo", "messages": [{"role": "user", "content": "hello there"}]}
EVIL = "evil.example"


@contextlib.asynccontextmanager
async def served(**server: Any) -> AsyncIterator[tuple[Any, httpx.AsyncClient, str]]:
    config = load_config(environ={}, cli={"starter_models": False, "models": MODELS, "server": server})
    app = create_app(config)
    async with live_server(app) as url, httpx.AsyncClient(base_url=url, timeout=30) as http:
        yield app, http, url


def state(app: Any, model: str) -> str:
    return str(app.state.pool.status(model).state)


def form_post() -> dict[str, Any]:
    """What `<form method=post enctype=multipart/form-data>` sends to the transcription route."""
    return {"files": {"file": ("a.wav", wav_bytes(8000, 0.5), "audio/wav")}, "data": {"model": "stt"}}


async def test_a_rebound_dns_name_reaches_no_route() -> None:
    """DNS rebinding: `evil.example` now resolves to 127.0.0.1, so the browser connects here
    with `Host: evil.example`. The admin API, inference, MCP and the open routes all refuse."""
    async with served() as (app, http, url):
        port = url.rsplit(":", 1)[1]
        for host in (EVIL, f"{EVIL}:{port}", f"127.0.0.1.{EVIL}:{port}", f"localhost.{EVIL}"):
            headers = {"Host": host}
            loaded = await http.post("/v1/admin/models/echo/load", headers=headers)
            chatted = await http.post("/v1/chat/completions", json=CHAT, headers=headers)
            listed = await http.get("/v1/models", headers=headers)
            ready = await http.get("/readyz", headers=headers)
            tools = await http.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                                    headers={**headers, "Accept": "application/json, text/event-stream"})  # fmt: skip
            for refused in (loaded, chatted, listed, ready):
                assert refused.status_code == 421, (host, refused.text)
                error = refused.json()["error"]
                assert error["code"] == "host_not_allowed" and error["type"] == "invalid_request_error"
                assert host in error["message"] and "server.allowed_hosts" in error["message"]
            assert tools.status_code == 421 and "Invalid Host" in tools.text
        assert state(app, "echo") == "unloaded"  # the admin load never happened
        # The same requests by the server's own names are served.
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", "127.8.9.10", f"[::1]:{port}"):
            listed = await http.get("/v1/models", headers={"Host": host})
            assert listed.status_code == 200, (host, listed.text)
        assert (await http.post("/v1/admin/models/echo/load")).status_code == 200
        assert state(app, "echo") == "ready"


async def test_a_cross_site_form_post_is_refused() -> None:
    """A page on evil.example posts a multipart upload with a plain HTML form: no CORS
    preflight stops that, and the loopback server has no key. Refused before the upload is
    read; the model never loads."""
    async with served() as (app, http, _):
        for origin in (f"http://{EVIL}", f"https://{EVIL}:8443", "null"):
            posted = await http.post("/v1/audio/transcriptions", headers={"Origin": origin}, **form_post())
            assert posted.status_code == 403, (origin, posted.text)
            error = posted.json()["error"]
            assert error["code"] == "origin_not_allowed" and error["type"] == "permission_error"
        chatted = await http.post("/v1/chat/completions", json=CHAT, headers={"Origin": f"http://{EVIL}"})
        assert chatted.status_code == 403
        assert state(app, "stt") == "unloaded" and state(app, "echo") == "unloaded"
        # A GET changes nothing: a foreign page may send one (CORS keeps the answer from it).
        assert (await http.get("/v1/models", headers={"Origin": f"http://{EVIL}"})).status_code == 200


async def test_sdk_clients_and_the_workbench_still_work() -> None:
    """The official SDK sends no Origin and a loopback Host; the workbench posts from the
    server's own origin; a dev server on this machine (localhost:5173) is a loopback page."""
    async with served() as (_, http, url):
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        async with client:
            answer = await client.chat.completions.create(model="echo", messages=[{"role": "user", "content": "hi"}])
            heard = await client.audio.transcriptions.create(model="stt", file=("a.wav", wav_bytes(8000, 0.5)))
        assert answer.choices[0].message.content == "hi " and heard.text == "4000"
        for origin in (url, url.replace("127.0.0.1", "localhost"), "http://localhost:5173"):
            posted = await http.post("/v1/audio/transcriptions", headers={"Origin": origin}, **form_post())
            assert posted.status_code == 200 and posted.json()["text"] == "4000", (origin, posted.text)


async def test_configured_names_and_origins_are_served() -> None:
    """A name in `server.allowed_hosts` (a reverse proxy's) and a page in `cors_origins`."""
    app_origin = "https://app.example.com"
    async with served(allowed_hosts=["gpu-box.lan", "*.corp.example:8443"], cors_origins=[app_origin]) as (_, http, _):
        for host in ("gpu-box.lan", "gpu-box.lan:8000", "api.corp.example:8443"):
            assert (await http.get("/v1/models", headers={"Host": host})).status_code == 200, host
        for host in ("api.corp.example", "corp.example:8443", EVIL):
            assert (await http.get("/v1/models", headers={"Host": host})).status_code == 421, host
        posted = await http.post("/v1/chat/completions", json=CHAT, headers={"Origin": app_origin})
        assert posted.status_code == 200, posted.text
        # The workbench served through the proxy's name posts from that name.
        proxied = {"Host": "gpu-box.lan", "Origin": "http://gpu-box.lan"}
        assert (await http.post("/v1/chat/completions", json=CHAT, headers=proxied)).status_code == 200


@pytest.mark.parametrize(
    ("server", "host", "origin", "refused"),
    [
        ({}, "evil.example", None, "host_not_allowed"),
        ({}, "127.0.0.1:8000", "http://evil.example", "origin_not_allowed"),
        ({}, "127.0.0.1:8000", "http://127.0.0.1:8000", None),
        ({}, None, None, None),  # HTTP/1.0: no Host, no browser
        ({"host": "0.0.0.0"}, "gpu-box.lan:8000", None, None),  # bound beyond loopback: keys guard it
        ({"host": "0.0.0.0"}, "gpu-box.lan:8000", "http://evil.example", "origin_not_allowed"),
        ({"host": "0.0.0.0", "allowed_hosts": ["gpu-box.lan"]}, "evil.example", None, "host_not_allowed"),
        ({"cors_origins": ["*"]}, "evil.example", "http://evil.example", None),  # any page may call anyway
        ({"host": "::1"}, "[::1]:8000", None, None),
        ({"host": "localhost"}, "localhost.evil.example", None, "host_not_allowed"),
    ],
)
def test_the_rule(server: dict[str, Any], host: str | None, origin: str | None, refused: str | None) -> None:
    rule = BrowserRule.from_config(ServerConfig.model_validate(server))
    problem = rule.host_problem(host) or rule.origin_problem(origin, host)
    assert (problem.code if problem else None) == refused


def test_allowed_hosts_must_be_host_names() -> None:
    for entry in ("http://gpu-box.lan", "gpu-box.lan/api", "gpu box"):
        with pytest.raises(ValueError, match="is not a host"):
            ServerConfig.model_validate({"allowed_hosts": [entry]})


async def test_accepted_hosts_are_remembered_up_to_a_bound_and_a_bad_one_is_still_refused() -> None:
    """The guard remembers Host headers it accepted (parsing one costs more than the rest of
    the check), at most KNOWN_HOSTS of them: a client sending a new allowed name on every
    request grows nothing without bound, and a bad name between good ones is refused each time."""
    async with served(allowed_hosts=["*.corp.example"]) as (app, http, _):
        guard = app.middleware_stack
        while not isinstance(guard, HostGuard):
            guard = guard.app
        for number in range(KNOWN_HOSTS + 40):
            good = await http.get("/v1/models", headers={"Host": f"box{number}.corp.example"})
            assert good.status_code == 200, good.text
            bad = await http.get("/v1/models", headers={"Host": EVIL})
            assert bad.status_code == 421, bad.text
        assert len(guard._good_hosts) == KNOWN_HOSTS
        assert (await http.get("/v1/models", headers={"Host": "box0.corp.example"})).status_code == 200
        assert (await http.get("/v1/models", headers={"Host": "box0.corp.example.evil"})).status_code == 421
