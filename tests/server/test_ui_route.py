"""The workbench's files over HTTP (no browser): the security headers on the page and on its
assets, revalidation (`no-cache`), the right content type for every file (a module script
under `nosniff` must come as JavaScript), no way out of the static folder, nothing at all
with `server.ui: false`, and the metrics history refusing a `since` that is not a time."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, MutableMapping
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from modelpool.config import load_config
from modelpool.server.app import create_app
from modelpool.ui import STATIC_DIR

TYPES = {".js": "text/javascript", ".css": "text/css", ".html": "text/html"}


def app_with(**server: Any) -> FastAPI:
    return create_app(load_config(None, cli={"starter_models": False, "server": server}, environ={}))


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app_with())
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        yield client


def csp_of(response: httpx.Response) -> dict[str, str]:
    directives = [part.strip().split(" ", 1) for part in response.headers["content-security-policy"].split(";")]
    return {name: value for name, value in directives}


@pytest.mark.parametrize("path", ["/ui/", "/ui/static/app.js", "/ui/static/style.css"])
async def test_the_page_and_its_assets_carry_the_security_headers(http: httpx.AsyncClient, path: str) -> None:
    response = await http.get(path)
    assert response.status_code == 200
    csp = csp_of(response)
    assert (csp["script-src"], csp["style-src"], csp["connect-src"]) == ("'self'", "'self'", "'self'")
    assert (csp["form-action"], csp["object-src"], csp["base-uri"]) == ("'none'", "'none'", "'none'")
    assert response.headers["x-content-type-options"] == "nosniff"
    assert response.headers["cache-control"] == "no-cache"


async def test_an_asset_revalidates_with_its_etag(http: httpx.AsyncClient) -> None:
    first = await http.get("/ui/static/lib.js")
    again = await http.get("/ui/static/lib.js", headers={"If-None-Match": first.headers["etag"]})
    assert (again.status_code, again.content) == (304, b"")
    assert again.headers["cache-control"] == "no-cache"


async def test_every_static_file_is_served_with_its_type(http: httpx.AsyncClient) -> None:
    files = sorted(path for path in STATIC_DIR.iterdir() if path.is_file())
    assert {path.suffix for path in files} == set(TYPES)
    for path in files:
        response = await http.get(f"/ui/static/{path.name}")
        assert response.status_code == 200, path.name
        assert response.headers["content-type"].split(";")[0] == TYPES[path.suffix], path.name
        assert response.content == path.read_bytes()


async def test_the_page_references_only_files_that_exist(http: httpx.AsyncClient) -> None:
    page = (await http.get("/ui/")).text
    referenced = re.findall(r'(?:src|href)="/ui/static/([^"]+)"', page)
    assert {"app.js", "style.css"} <= set(referenced)
    assert [name for name in referenced if not (STATIC_DIR / name).is_file()] == []
    # Modules import each other by relative path: each import names a file that is there.
    for script in STATIC_DIR.glob("*.js"):
        imported = re.findall(r'from "\./([^"]+)"', script.read_text())
        assert [name for name in imported if not (STATIC_DIR / name).is_file()] == [], script.name


async def raw_get(app: FastAPI, path: str) -> int:
    """The status of a GET for `path` exactly as given: an HTTP client would resolve `..`."""
    messages: list[MutableMapping[str, Any]] = []
    answered = asyncio.Event()
    requested = False

    async def receive() -> dict[str, Any]:
        nonlocal requested
        if not requested:
            requested = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await answered.wait()  # then the client goes, as a real one would
        return {"type": "http.disconnect"}

    async def send(message: MutableMapping[str, Any]) -> None:
        messages.append(message)
        if message["type"] == "http.response.body" and not message.get("more_body"):
            answered.set()

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
        "path": path, "raw_path": path.encode(), "root_path": "", "query_string": b"",
        "headers": [(b"host", b"127.0.0.1")], "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80),
    }  # fmt: skip
    await app(scope, receive, send)
    return int(next(m["status"] for m in messages if m["type"] == "http.response.start"))


async def test_no_path_leads_out_of_the_static_folder(http: httpx.AsyncClient) -> None:
    app = app_with()
    assert (STATIC_DIR / "../../config/schema.py").is_file()  # what a way out would serve
    assert await raw_get(app, "/ui/static/app.js") == 200
    assert await raw_get(app, "/ui/static/../../config/schema.py") == 404
    assert await raw_get(app, "/ui/static/../__init__.py") == 404
    for path in ("/ui/static/%2e%2e/%2e%2e/config/schema.py", "/ui/static/..%2f..%2fconfig/schema.py"):
        assert (await http.get(path)).status_code == 404, path


async def test_with_the_ui_off_there_is_nothing_at_ui() -> None:
    transport = httpx.ASGITransport(app=app_with(ui=False))
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
        for path in ("/ui", "/ui/", "/ui/static/app.js"):
            assert (await http.get(path)).status_code == 404, path
        assert (await http.get("/healthz")).status_code == 200


@pytest.mark.parametrize("since", ["nan", "inf", "-inf", "1e999"])
async def test_metrics_history_refuses_a_since_that_is_not_a_time(http: httpx.AsyncClient, since: str) -> None:
    response = await http.get("/metrics/history", params={"since": since})
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["type"], error["code"], error["param"]) == ("invalid_request_error", "invalid_value", "since")
    assert (await http.get("/metrics/history", params={"since": "1700000000.5"})).status_code == 200
