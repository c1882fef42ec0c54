"""CORS for browser clients (`server.cors_origins`; empty: off, no CORS headers at all).

Starlette's CORSMiddleware answers preflights itself, before the API-key check: a
preflight carries no credentials, so it could never pass that check. It is the outermost
middleware, so 401s, 429s and the last-resort 500 carry CORS headers too and a browser
client can read the error instead of seeing a bare network failure.
"""

from __future__ import annotations

from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware

from modelpool.config.schema import ServerConfig

# Headers a browser script may read from a response: the request id to report, when to
# come back after a 429/503, and what is left of the caller's rate limits.
RATELIMIT_HEADERS = tuple(
    f"x-ratelimit-{what}-{kind}" for what in ("limit", "remaining", "reset") for kind in ("requests", "tokens")
)
EXPOSED_HEADERS = ("X-Request-ID", "Retry-After", "retry-after-ms", *RATELIMIT_HEADERS)
ALLOWED_METHODS = ("GET", "POST")  # the API has no other methods
PREFLIGHT_MAX_AGE_S = 600


def add_cors(app: FastAPI, server: ServerConfig) -> None:
    if not server.cors_origins:
        return
    app.add_middleware(
        CORSMiddleware,
        allow_origins=list(server.cors_origins),
        allow_methods=list(ALLOWED_METHODS),
        # Any request header: the official SDKs send their own (x-stainless-*, openai-beta, ...);
        # which origins may call at all is the guard.
        allow_headers=["*"],
        allow_credentials=server.cors_allow_credentials,
        expose_headers=list(EXPOSED_HEADERS),
        max_age=PREFLIGHT_MAX_AGE_S,
    )
