"""The slot's lifecycle rules as tables: (facts, event) → decision, with no event loop."""

from __future__ import annotations

import pytest

from modelpool.runtime.lifecycle import (
    GAVE_UP_RETRY_AFTER_S,
    Action,
    Decision,
    Event,
    Facts,
    Policy,
    Refusal,
    SlotState,
    decide,
)

U, L, R, D, F = SlotState.UNLOADED, SlotState.LOADING, SlotState.READY, SlotState.UNLOADING, SlotState.FAILED
NOW = 100.0
MANUAL = Policy(autoload=False)
POLICY = Policy(autoload=True, retry_cooldown_s=30.0, restart_backoff_s=2.0, max_restarts=3)


@pytest.mark.parametrize(
    ("facts", "event", "expected"),
    [
        # Requests and explicit loads.
        (Facts(U, NOW), Event.REQUEST, Decision(L, Action.LOAD)),
        (Facts(U, NOW, MANUAL), Event.REQUEST, Decision(U, Action.REFUSE, refusal=Refusal.NOT_LOADED)),
        (Facts(U, NOW, MANUAL), Event.LOAD, Decision(L, Action.LOAD)),
        (Facts(L, NOW), Event.REQUEST, Decision(L, Action.WAIT)),
        (Facts(R, NOW), Event.REQUEST, Decision(R, Action.SERVE)),
        (Facts(D, NOW), Event.REQUEST, Decision(D, Action.WAIT)),
        # A failed load: the error again during the cooldown, a new load after it.
        (Facts(F, NOW, POLICY, failed_at=NOW - 10), Event.REQUEST,
         Decision(F, Action.REFUSE, refusal=Refusal.COOLDOWN, retry_after_s=20.0)),
        (Facts(F, NOW, POLICY, failed_at=NOW - 10), Event.LOAD,
         Decision(F, Action.REFUSE, refusal=Refusal.COOLDOWN, retry_after_s=20.0)),
        (Facts(F, NOW, POLICY, failed_at=NOW - 30), Event.REQUEST, Decision(L, Action.LOAD)),
        # Crashes: restart after a backoff that doubles with the row, then give up.
        (Facts(F, NOW, POLICY, failed_at=NOW - 0.5, crashes_in_a_row=1), Event.REQUEST,
         Decision(L, Action.LOAD, delay_s=1.5)),
        (Facts(F, NOW, POLICY, failed_at=NOW - 1, crashes_in_a_row=3), Event.REQUEST,
         Decision(L, Action.LOAD, delay_s=7.0)),
        (Facts(F, NOW, POLICY, failed_at=NOW - 60, crashes_in_a_row=2), Event.REQUEST,
         Decision(L, Action.LOAD, delay_s=0.0)),
        (Facts(F, NOW, POLICY, failed_at=NOW, crashes_in_a_row=4), Event.REQUEST,
         Decision(F, Action.REFUSE, refusal=Refusal.GAVE_UP, retry_after_s=GAVE_UP_RETRY_AFTER_S)),
        # What a load, a crash and an unload lead to.
        (Facts(L, NOW), Event.LOADED, Decision(R)),
        (Facts(L, NOW), Event.LOAD_FAILED, Decision(F, Action.CLEANUP)),
        (Facts(L, NOW), Event.LOAD_ABANDONED, Decision(U, Action.CLEANUP)),  # no request waits: not a failure
        (Facts(R, NOW), Event.CRASHED, Decision(F, Action.CLEANUP)),
        (Facts(D, NOW), Event.CRASHED, Decision(D)),  # being stopped anyway
        (Facts(U, NOW), Event.CRASHED, Decision(U)),
        (Facts(R, NOW), Event.UNLOAD, Decision(D, Action.DRAIN)),
        (Facts(F, NOW), Event.UNLOAD, Decision(U, Action.FORGET)),
        (Facts(U, NOW), Event.UNLOAD, Decision(U)),
        (Facts(D, NOW), Event.STOPPED, Decision(U)),
        # Keep-alive.
        (Facts(R, NOW, expires_at=NOW), Event.TICK, Decision(R, Action.UNLOAD)),
        (Facts(R, NOW, expires_at=NOW + 1), Event.TICK, Decision(R)),
        (Facts(R, NOW, expires_at=NOW - 1, busy=True), Event.TICK, Decision(R)),
        (Facts(R, NOW, expires_at=None), Event.TICK, Decision(R)),
        (Facts(L, NOW, expires_at=NOW - 1), Event.TICK, Decision(L)),
    ],
)  # fmt: skip
def test_decide(facts: Facts, event: Event, expected: Decision) -> None:
    assert decide(facts, event) == expected


@pytest.mark.parametrize("state", list(SlotState))
@pytest.mark.parametrize("event", [Event.LOADED, Event.LOAD_FAILED, Event.LOAD_ABANDONED, Event.STOPPED])
def test_completion_events_change_only_the_state_they_complete(state: SlotState, event: Event) -> None:
    completes = {Event.LOADED: L, Event.LOAD_FAILED: L, Event.LOAD_ABANDONED: L, Event.STOPPED: D}[event]
    decision = decide(Facts(state, NOW), event)
    if state is not completes:
        assert decision == Decision(state)
    else:
        assert decision.state is not state
