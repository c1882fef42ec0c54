"""`modelpool ready`: wait until a server's `/readyz` answers 200, for service managers.

Why a command and not a `curl` loop: systemd's `ExecStartPost=`, a container `HEALTHCHECK`
or a deploy script needs one exit status that means "the preloaded models serve now", and
the details a loop gets wrong are already settled in the client's readiness probe (a
refused connection or a 503 `model_not_ready` means "not yet"; a model that failed to
load fails at once, since waiting will not fix it). Without `--url` the server is the one
the config names (`server.host`/`server.port`, `MODELPOOL_SERVER__*` included), so a unit
file passes the same `--config` to `serve` and to `ready` and never repeats the port.
"""

from __future__ import annotations

import asyncio
import ipaddress
from typing import Annotated

import httpx
import typer

from modelpool.cli.output import echo_err
from modelpool.client.errors import ClientError
from modelpool.client.readiness import ReadinessProbe
from modelpool.client.transport import Transport
from modelpool.config.schema import ServerConfig

MAX_WAIT_S = 86_400.0
"""A day: longer than any download or load; a bigger number is a typo, not a plan."""
POLL_S = 0.5
REQUEST_TIMEOUT_S = 10.0
"""One /readyz answer is instant; a server that takes longer is stuck, and is asked again."""


WaitOpt = Annotated[
    float,
    typer.Option(
        "--wait",
        min=0,
        max=MAX_WAIT_S,
        help="Seconds to keep asking while the server starts or loads (0: ask once). At most a day.",
    ),
]
ModelOpt = Annotated[
    str | None,
    typer.Option("--model", help="Wait for this model only (ready, or would load on demand) instead of all preloaded."),
]
ReadyUrlOpt = Annotated[
    str | None,
    typer.Option("--url", envvar="MODELPOOL_URL", help="Server to ask (default: the one the config names)."),
]


def url_of(server: ServerConfig) -> str:
    """Where a local client reaches the server the config binds: a wildcard address (all
    interfaces) is reached on loopback, an IPv6 address in brackets."""
    if server.port == 0:
        raise ValueError("server.port is 0 (a free port picked at start): give the server's URL with --url")
    host = server.host or "127.0.0.1"
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return f"http://{host}:{server.port}"  # a host name
    if address.is_unspecified:
        address = ipaddress.ip_address("::1" if address.version == 6 else "127.0.0.1")
    shown = f"[{address}]" if address.version == 6 else str(address)
    return f"http://{shown}:{server.port}"


def checked_url(url: str) -> str:
    """An http(s) URL with a host, or a usage error (exit 2) that says what is wrong."""
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise typer.BadParameter(f"not a URL: {exc}", param_hint="--url") from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise typer.BadParameter(f"{url!r} is not an http:// or https:// URL with a host", param_hint="--url")
    return url.rstrip("/")


def wait_until_ready(url: str, *, api_key: str | None, model: str | None, wait_s: float) -> None:
    """Return once `url`'s /readyz answers 200; exit 1 with one line on stderr when it does
    not within `wait_s`, or says something waiting cannot fix (a load error, an unknown model)."""
    try:
        asyncio.run(_probe(url, api_key, model or "", wait_s))
    except ClientError as exc:
        echo_err(f"error: {exc.message}")
        raise typer.Exit(1) from None
    typer.echo(f"ready: {url}" + (f" ({model})" if model else ""))


async def _probe(url: str, api_key: str | None, model: str, wait_s: float) -> None:
    timeout_s = min(REQUEST_TIMEOUT_S, max(wait_s, 1.0))
    transport = Transport(url, api_key=api_key, timeout_s=timeout_s, connect_timeout_s=timeout_s)
    try:
        await ReadinessProbe(transport, ("/readyz",), model, poll_s=POLL_S).wait(wait_s)
    finally:
        await transport.aclose()
