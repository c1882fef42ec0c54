"""A model slot's lifecycle decisions, as one pure function of (facts, event).

    unloaded ──request/load──► loading ──loaded──► ready ──unload──► unloading ──stopped──► unloaded
                                  │                  └──crashed──► failed
                                  └──load_failed──► failed ──request (cooldown over)──► loading
                                                           └──request (after crash backoff)──► loading

`decide` never does anything: it says what should happen, and the slot (the owner) applies
it. So the rules are tested by tables, as llama-swap's scheduler is, without event loops,
engines or sleeps. Callers never read the state and act on it themselves.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class SlotState(str, Enum):
    UNLOADED = "unloaded"
    LOADING = "loading"
    READY = "ready"
    UNLOADING = "unloading"
    FAILED = "failed"


class Event(str, Enum):
    REQUEST = "request"
    """A request wants the model: loads it only if autoload is on."""
    LOAD = "load"
    """An explicit load (admin, preload): loads whatever autoload says."""
    LOADED = "loaded"
    LOAD_FAILED = "load_failed"
    LOAD_ABANDONED = "load_abandoned"
    """A load a request started stopped before it made room: nobody waits for it any more."""
    CRASHED = "crashed"
    """An engine process died unasked."""
    UNLOAD = "unload"
    STOPPED = "stopped"
    """Every replica of an unload has stopped."""
    TICK = "tick"
    """Time passed: the reaper's look at keep-alive."""


class Action(str, Enum):
    NONE = "none"
    SERVE = "serve"
    """Ready: go ahead."""
    WAIT = "wait"
    """A load is under way: wait for it."""
    LOAD = "load"
    """Start a load (after `delay_s`)."""
    REFUSE = "refuse"
    """Answer the request with the `refusal`."""
    CLEANUP = "cleanup"
    """Stop what is left of crashed replicas."""
    DRAIN = "drain"
    """Let running requests finish (or cut them off), then stop every replica."""
    FORGET = "forget"
    """Drop the failure: the next request starts afresh."""
    UNLOAD = "unload"
    """Idle past keep-alive: unload."""


class Refusal(str, Enum):
    NOT_LOADED = "not_loaded"
    """Unloaded, autoload off: an admin must load it."""
    COOLDOWN = "cooldown"
    """The last load failed a moment ago: the error again, until `retry_cooldown_s` passed."""
    GAVE_UP = "gave_up"
    """The engine crashed `max_restarts` times in a row: no more restarts until an explicit load."""


@dataclass(frozen=True)
class Policy:
    """The model's settings that the decisions depend on."""

    autoload: bool = True
    retry_cooldown_s: float = 30.0
    restart_backoff_s: float = 1.0
    max_restarts: int = 5


@dataclass(frozen=True)
class Facts:
    state: SlotState
    now: float
    policy: Policy = Policy()
    failed_at: float | None = None
    crashes_in_a_row: int = 0
    """Crashes of the engine process in a row (0: the failure, if any, was a failed load)."""
    busy: bool = False
    """Requests run or wait."""
    expires_at: float | None = None
    """Keep-alive deadline (None: never)."""


@dataclass(frozen=True)
class Decision:
    state: SlotState
    """The state to be in from now."""
    action: Action = Action.NONE
    delay_s: float = 0.0
    """LOAD: wait this long first (crash backoff)."""
    refusal: Refusal | None = None
    retry_after_s: float = 0.0
    """REFUSE: when trying again makes sense."""


GAVE_UP_RETRY_AFTER_S = 60.0


def decide(facts: Facts, event: Event) -> Decision:
    state = facts.state
    if event in (Event.REQUEST, Event.LOAD):
        return _demand(facts, explicit=event is Event.LOAD)
    if event is Event.LOADED and state is SlotState.LOADING:
        return Decision(SlotState.READY)
    if event is Event.LOAD_FAILED and state is SlotState.LOADING:
        return Decision(SlotState.FAILED, Action.CLEANUP)
    if event is Event.LOAD_ABANDONED and state is SlotState.LOADING:
        return Decision(SlotState.UNLOADED, Action.CLEANUP)  # not a failure: the next request loads afresh
    if event is Event.CRASHED and state is SlotState.READY:
        return Decision(SlotState.FAILED, Action.CLEANUP)
    if event is Event.UNLOAD:
        return _unload(state)
    if event is Event.STOPPED and state is SlotState.UNLOADING:
        return Decision(SlotState.UNLOADED)
    if event is Event.TICK and _expired(facts):
        return Decision(state, Action.UNLOAD)
    return Decision(state)


def _demand(facts: Facts, *, explicit: bool) -> Decision:
    state, policy = facts.state, facts.policy
    if state is SlotState.READY:
        return Decision(state, Action.SERVE)
    if state is SlotState.LOADING:
        return Decision(state, Action.WAIT)
    since_failure = facts.now - (facts.failed_at or 0.0)
    if state is SlotState.FAILED and facts.crashes_in_a_row:
        if facts.crashes_in_a_row > policy.max_restarts:
            return Decision(state, Action.REFUSE, refusal=Refusal.GAVE_UP, retry_after_s=GAVE_UP_RETRY_AFTER_S)
        backoff = policy.restart_backoff_s * 2 ** (facts.crashes_in_a_row - 1)
        return Decision(SlotState.LOADING, Action.LOAD, delay_s=max(0.0, backoff - since_failure))
    if state is SlotState.FAILED and since_failure < policy.retry_cooldown_s:
        wait = policy.retry_cooldown_s - since_failure
        return Decision(state, Action.REFUSE, refusal=Refusal.COOLDOWN, retry_after_s=wait)
    if state is SlotState.UNLOADED and not (explicit or policy.autoload):
        return Decision(state, Action.REFUSE, refusal=Refusal.NOT_LOADED)
    if state is SlotState.UNLOADING:
        return Decision(state, Action.WAIT)  # the slot waits for the unload, then asks again
    return Decision(SlotState.LOADING, Action.LOAD)


def _unload(state: SlotState) -> Decision:
    if state is SlotState.READY:
        return Decision(SlotState.UNLOADING, Action.DRAIN)
    if state is SlotState.FAILED:
        return Decision(SlotState.UNLOADED, Action.FORGET)
    return Decision(state)


def _expired(facts: Facts) -> bool:
    return (
        facts.state is SlotState.READY
        and not facts.busy
        and facts.expires_at is not None
        and facts.now >= facts.expires_at
    )
