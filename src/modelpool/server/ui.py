"""The workbench at `/ui`. The page and its assets are open (like /metrics): every call it
makes goes through the API with the key the user enters, so scopes apply as for any client."""

from __future__ import annotations

import os
from os import PathLike

from fastapi import FastAPI
from fastapi.responses import FileResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from modelpool.ui import STATIC_DIR

# Everything the page loads comes from this server: a script from anywhere else is refused
# by the browser, so an injected tag cannot phone home. blob:/data: for audio and images
# made in the page (recordings, uploads, synthesised speech). No form is ever submitted to a
# URL (the page's forms are handled in script, the key dialog's is `method="dialog"`), so
# `form-action 'none'`: an injected form cannot post what is typed into it elsewhere.
_CSP = (
    "default-src 'self'; img-src 'self' data: blob:; media-src 'self' blob: data:; "
    "connect-src 'self'; style-src 'self'; script-src 'self'; object-src 'none'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
# With `nosniff` a module script must come as JavaScript; the platform's MIME table may say
# otherwise (Windows' registry maps .js to text/plain on some machines), so it is set here.
_JS = "text/javascript; charset=utf-8"
_SECURITY_HEADERS = [
    (b"content-security-policy", _CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
]


class _UiHeaders:
    """Adds the page's security headers to everything under /ui."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/ui"):
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *_SECURITY_HEADERS]
            await send(message)

        await self.app(scope, receive, with_headers)


class _Assets(StaticFiles):
    """The page's files, revalidated on every load (`no-cache`: a 304 on the ETag costs
    little, and an upgraded server's page never runs with last version's scripts)."""

    def file_response(self, full_path: PathLike[str] | str, stat_result: os.stat_result, scope: Scope,
                      status_code: int = 200) -> Response:  # fmt: skip
        response = super().file_response(full_path, stat_result, scope, status_code)
        response.headers["cache-control"] = "no-cache"
        if str(full_path).endswith(".js") and "content-type" in response.headers:
            response.headers["content-type"] = _JS
        return response


def mount_ui(app: FastAPI) -> None:
    @app.get("/ui", include_in_schema=False)
    async def ui_root() -> RedirectResponse:
        return RedirectResponse("/ui/", status_code=307)

    @app.get("/ui/", include_in_schema=False)
    async def ui_index() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html", headers={"cache-control": "no-cache"})

    app.mount("/ui/static", _Assets(directory=STATIC_DIR), name="ui-static")
    app.add_middleware(_UiHeaders)
