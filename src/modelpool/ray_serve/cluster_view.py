"""The ingress's picture of the model replicas, refreshed in the background: each replica's
own pool statuses (asked of every replica at once) and Ray Serve's count of replicas per
state. The API reads it without waiting (`/v1/admin/models`, `/readyz`, the metrics page)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace
from enum import Enum
from typing import Any

from ray import serve
from ray.serve.handle import DeploymentHandle

from modelpool.ray_serve.remote import ControlThread
from modelpool.ray_serve.wire import ReplicaReport
from modelpool.status import ModelStatus, ReplicaStatus

log = logging.getLogger("modelpool.ray")
_STARTING = ("STARTING", "UPDATING", "RECOVERING")
_STATE_ORDER = ("ready", "loading", "failed", "unloading", "unloaded")


class ClusterView:
    def __init__(
        self,
        handles: Callable[[str], Awaitable[DeploymentHandle[Any]]],
        apps: list[str],
        grouped_apps: set[str],
        interval_s: float,
        control: ControlThread,
    ) -> None:
        self._handles = handles
        self._grouped_apps = grouped_apps
        self._control = control
        self._apps = apps
        self.interval_s = interval_s
        self.reports: dict[str, list[ReplicaReport]] = {app: [] for app in apps}
        """Per application: the last report of each replica that answered."""
        self.replica_states: dict[str, dict[str, int]] = {app: {} for app in apps}
        """Per application: Ray Serve's replica count per replica state."""
        self.refreshed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._refresh_forever(), name="ray-cluster-view")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def refresh(self) -> None:
        status = await self._control.run(serve.status)
        for app in self._apps:
            found = status.applications.get(app)
            states: dict[str, int] = {}
            if found is not None:
                for deployment in found.deployments.values():
                    for state, count in deployment.replica_states.items():
                        # Annotated as ReplicaState, but serve.status() hands over plain strings.
                        key = state.value if isinstance(state, Enum) else str(state)
                        states[key] = states.get(key, 0) + count
            self.replica_states[app] = states
        answers = await asyncio.gather(*(self._ask(app) for app in self._apps))
        for app, reports in zip(self._apps, answers, strict=True):
            self.reports[app] = reports
        self.refreshed.set()

    async def _ask(self, app: str) -> list[ReplicaReport]:
        if not self.replica_states[app].get("RUNNING"):
            return []
        try:
            handle = await self._handles(app)
            answers = await handle.broadcast("report").results_async(timeout_s=5, return_exceptions=True)
        except Exception as exc:  # the app was being redeployed or removed: try again next time
            log.debug("status broadcast failed", exc_info=exc, extra={"app": app})
            return self.reports.get(app, [])
        return [answer for answer in answers if isinstance(answer, ReplicaReport)]

    async def _refresh_forever(self) -> None:
        while True:
            try:
                await self.refresh()
            except Exception:
                log.exception("could not read the state of the Ray Serve replicas")
            await asyncio.sleep(self.interval_s)

    def merged(self, app: str, template: ModelStatus) -> ModelStatus:
        """`template` (the model as configured, never loaded) with what its replicas said."""
        per_replica: list[tuple[ReplicaReport, ModelStatus]] = [
            (report, status)
            for report in self.reports[app]
            for status in report.statuses
            # a group's replica counts for the models it holds; a model's own, for it even unloaded
            if status.id == template.id and (app not in self._grouped_apps or status.state != "unloaded")
        ]
        replicas = [
            ReplicaStatus(
                index=index,
                running=sum(r.running for r in status.replicas),
                served=sum(r.served for r in status.replicas),
                memory_bytes=sum(r.memory_bytes for r in status.replicas),
                retiring=False,
                pid=next((r.pid for r in status.replicas if r.pid is not None), None),
                port=next((r.port for r in status.replicas if r.port is not None), None),
                node_id=report.placement.node_id,
                node_ip=report.placement.node_ip,
                ray_replica=report.placement.replica_id,
            )
            for index, (report, status) in enumerate(per_replica)
        ]
        by_node: dict[str, int] = {}
        for replica in replicas:
            by_node[replica.node_id or "?"] = by_node.get(replica.node_id or "?", 0) + 1
        states = self.replica_states[app]
        wanted = states.get("RUNNING", 0) + sum(states.get(s, 0) for s in _STARTING)
        return replace(
            template,
            state=self._state(
                [status.state for _, status in per_replica], starting=self._starting(app, wanted, replicas)
            ),
            replicas=replicas,
            replicas_wanted=wanted,
            in_flight=sum(status.in_flight for _, status in per_replica),
            queued=sum(status.queued for _, status in per_replica),
            loaded_at=min((s.loaded_at for _, s in per_replica if s.loaded_at is not None), default=None),
            load_seconds=max((s.load_seconds for _, s in per_replica if s.load_seconds is not None), default=None),
            last_error=next((s.last_error for _, s in per_replica if s.last_error), None),
            expires_in_s=max((s.expires_in_s for _, s in per_replica if s.expires_in_s is not None), default=None),
            options=per_replica[0][1].options if per_replica else template.options,
            replicas_by_node=by_node,
        )

    def _starting(self, app: str, wanted: int, replicas: list[ReplicaStatus]) -> bool:
        """Replicas are on their way for this model: more wanted than report it (a group's
        replicas hold only some of its models, so for a group: none running yet)."""
        if app in self._grouped_apps:
            return wanted > 0 and not self.replica_states[app].get("RUNNING")
        return wanted > len(replicas)

    @staticmethod
    def _state(replica_states: list[str], *, starting: bool) -> str:
        """The model's state over its replicas: ready if any replica can serve it."""
        for state in _STATE_ORDER:
            if state in replica_states:
                if state != "ready" and starting:
                    return "loading"
                return state
        return "loading" if starting else "unloaded"
