"""The pool as the root that assembles the server sees it: the interface the routes use, plus
the metrics registry and clock its middlewares and metrics history read. `ModelPool` and
the Ray ingress's `RemotePool` are both one (checked below and in `ray_serve.remote_pool`)."""

from __future__ import annotations

from typing import Protocol

from modelpool.pool_api import PoolApi
from modelpool.runtime.clock import Clock
from modelpool.runtime.metrics.prometheus import Metrics


class ServedPool(PoolApi, Protocol):
    @property
    def metrics(self) -> Metrics: ...

    @property
    def clock(self) -> Clock: ...
