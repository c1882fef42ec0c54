"""Live configuration: the config re-read from the sources `modelpool serve` started from
(its file, the `.local` override, the environment, the command line's models) and the
difference applied — on `POST /v1/admin/reload`, on SIGHUP, and when the file changes
(`server.watch_config`). Reloads are serialized: two never interleave. An invalid config
changes nothing; the error says why, in the reply or the log."""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from modelpool.config.reload_diff import LIVE_SECTIONS, ConfigDiff, diff_configs
from modelpool.config.schema import Config
from modelpool.errors import ConfigError, InvalidConfig, ModelpoolError
from modelpool.runtime.pool import ModelPool
from modelpool.runtime.ratelimit.limiter import RateLimiter
from modelpool.server.auth import KeyRing, check_exposure

log = logging.getLogger("modelpool")


@dataclass(frozen=True)
class ConfigSources:
    """Where a served config came from, to read it again."""

    reread: Callable[[], Config]
    """The same layers as at start (raises ConfigError); runs in a worker thread."""
    files: tuple[Path, ...] = ()
    """The config files among them (watched by `server.watch_config`); empty: none."""


class Reloader:
    def __init__(
        self,
        config: Config,
        sources: ConfigSources,
        pool: ModelPool,
        keys: KeyRing,
        limiter: RateLimiter,
        publish: Callable[[Config], None],
    ) -> None:
        """`publish(config)`: hand the routes the config now in effect (`app.state.config`)."""
        self.config = config
        """The config in effect: what the next reload is compared with."""
        self._started = config
        self._sources = sources
        self._pool = pool
        self._keys = keys
        self._limiter = limiter
        self._publish = publish
        self._lock = asyncio.Lock()
        self._stop = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._sighup = False
        if config.server.watch_config and not sources.files:
            raise ConfigError("server.watch_config: there is no config file to watch (start with --config)")

    async def reload(self, trigger: str) -> ConfigDiff:
        async with self._lock:
            try:
                wanted = await asyncio.to_thread(self._sources.reread)
                diff = diff_configs(self.config, wanted)
                keys = KeyRing.from_config(wanted.auth)
                check_exposure(self.in_effect(wanted), keys)
                prepared = await asyncio.to_thread(self._pool.prepare, wanted, diff)  # may import an engine
            except Exception as exc:  # any: a RecursionError from deeply nested YAML is a bad file too
                reason = exc.message if isinstance(exc, ModelpoolError) else _described(exc)
                log.error("config reload failed; the running config is unchanged: %s", reason,
                          extra={"trigger": trigger})  # fmt: skip
                raise InvalidConfig(f"{reason} (nothing changed: the running config stays)") from None
            self._pool.apply(prepared, diff)
            self._keys.replace(keys)
            self._limiter.reconfigure(wanted.auth)
            self.config = self.in_effect(wanted)  # a restart-only change stays pending: said again next time
            self._publish(self.config)
            log.info("config reloaded", extra={"trigger": trigger, **_log_fields(diff)})
            return diff

    def in_effect(self, wanted: Config) -> Config:
        """`wanted` as far as a reload applies it: the settings that need a restart stay as
        the server started with them."""
        kept = {name: getattr(self._started, name) for name in Config.model_fields if name not in LIVE_SECTIONS}
        return wanted.model_copy(update=kept)

    # ----- SIGHUP and the file watch, for as long as the app serves -------------------

    def start(self) -> None:
        """From inside the event loop: SIGHUP reloads (in the main thread only: a test's app
        served from another thread leaves signals alone), and the file watch starts if asked."""
        loop = asyncio.get_running_loop()
        if hasattr(signal, "SIGHUP") and threading.current_thread() is threading.main_thread():
            loop.add_signal_handler(signal.SIGHUP, self._in_background, "sighup")
            self._sighup = True
        if self.config.server.watch_config:
            self._keep(asyncio.create_task(self._watch(), name="config-watch"))

    async def stop(self) -> None:
        if self._sighup:
            asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
        self._stop.set()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _in_background(self, trigger: str) -> None:
        self._keep(asyncio.create_task(self._quietly(trigger), name=f"reload-{trigger}"))

    async def _quietly(self, trigger: str) -> None:
        """A reload whose failure is logged, never raised: the file watch and SIGHUP go on."""
        try:
            await self.reload(trigger)
        except InvalidConfig:
            pass  # logged by `reload`; the running config stays
        except Exception:
            log.exception("config reload failed", extra={"trigger": trigger})

    async def _watch(self) -> None:
        from watchfiles import awatch  # a dependency of uvicorn[standard]; loaded only when watching

        wanted = {path.resolve() for path in self._sources.files}
        folders = sorted({str(path.parent) for path in wanted})
        log.info("watching the config for changes", extra={"files": [str(path) for path in sorted(wanted)]})

        def ours(_: object, path: str) -> bool:  # editors replace a file: watch its folder, keep its name
            return Path(path).resolve() in wanted

        async for _changes in awatch(*folders, watch_filter=ours, stop_event=self._stop):
            await self._quietly("watch")

    def _keep(self, task: asyncio.Task[Any]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def _described(exc: Exception, limit: int = 300) -> str:
    """An unexpected error, named and cut short (a parser's message may quote the file)."""
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= limit else text[:limit] + "…"


def _log_fields(diff: ConfigDiff) -> dict[str, Any]:
    fields = asdict(diff)
    fields["reloading"] = [change.id for change in diff.reloading]
    fields["hot"] = [change.id for change in diff.hot]
    return fields
