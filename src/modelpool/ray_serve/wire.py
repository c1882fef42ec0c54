"""What goes between the ingress and a model replica (pickled by Ray). No Ray import here.

A replica never raises a ModelpoolError through Ray (Ray would wrap it in a RayTaskError
whose class attributes shadow the error's own): it returns `Failed` instead, and the
ingress raises the very error the single-process pool would have raised.

A streamed call yields `Started` once the replica holds the model's turn and has run the
work up to its first item (so problems with the request come back before any response
starts, as in one process), then an `Item` per result, then `Ended`; or `Failed` at any
point.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Generic, TypeVar

from modelpool.errors import ModelpoolError
from modelpool.pool_api.call import CallOptions
from modelpool.pool_api.results import Outcome
from modelpool.pool_api.timing import RequestTiming
from modelpool.status import ModelStatus

T = TypeVar("T")


@dataclass(frozen=True)
class Call:
    """One pool method to run on a replica: `pool.<method>(model, *args, options)`."""

    method: str
    model: str
    args: tuple[Any, ...]
    options: CallOptions
    request_id: str | None = None


@dataclass(frozen=True)
class Done(Generic[T]):
    outcome: Outcome[T]
    """The replica pool's whole result: its timing's tokens are counted again by the ingress
    (`uncounted`), which returns its own usage."""


@dataclass(frozen=True)
class Failed:
    error: ModelpoolError


@dataclass(frozen=True)
class Started:
    timing: RequestTiming
    """Load and queue waits and the replica index only (`waits_only`): the ingress times and
    counts the items itself as they pass."""
    audio_seconds: float | None = None
    """Transcriptions: the length of the decoded audio."""
    sample_rate: int | None = None
    """Speech: the rate of the samples to come."""


@dataclass(frozen=True)
class Item(Generic[T]):
    value: T


@dataclass(frozen=True)
class Ended:
    """The stream is over (the ingress counted its items as they passed)."""


Piece = Started | Item[Any] | Ended | Failed


def waits_only(timing: RequestTiming) -> RequestTiming:
    """What a stream's `Started` carries of the replica's timing. Not its tokens: the
    replica's prefetch has already seen the first chunk (the prompt's count), and the
    ingress sees that chunk again as an item; nor its clock (monotonic clocks differ)."""
    return RequestTiming(load_wait_s=timing.load_wait_s, queue_wait_s=timing.queue_wait_s, replica=timing.replica)


def uncounted(timing: RequestTiming) -> RequestTiming:
    """A copy of a replica's timing as the ingress's metrics must see it: none of its tokens
    counted yet (the replica's own counts stay in the replica)."""
    return replace(timing, counted_prompt_tokens=0, counted_output_tokens=0)


@dataclass(frozen=True)
class Placement:
    """Where a replica runs."""

    node_id: str
    node_ip: str
    replica_id: str


@dataclass(frozen=True)
class ReplicaReport:
    """A replica's answer to the ingress's status poll."""

    placement: Placement
    statuses: list[ModelStatus] = field(default_factory=list)
