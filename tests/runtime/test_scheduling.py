"""The order of a model's queue (runtime/scheduling.py), by tables: who arrives, who goes next."""

from __future__ import annotations

import asyncio

import pytest

from modelpool.config.loader import load_config
from modelpool.config.schema import AuthConfig
from modelpool.errors import ConfigError, Overloaded
from modelpool.inference import ChatMessage, ChatRequest
from modelpool.owner import Priority, Schedule
from modelpool.pool_api.call import CallOptions
from modelpool.pool_api.generation import collect
from modelpool.runtime.admission import Admission
from modelpool.runtime.metrics.prometheus import Metrics
from modelpool.runtime.scheduling import Entry, FairQueue, effective_rank, party_cap
from tests.fakes import FakeBackend, fake_slot, pool_of
from tests.polling import until

H, N, L = Priority.HIGH, Priority.NORMAL, Priority.LOW
REQUEST = ChatRequest((ChatMessage("user", "one two three"),))


def _order(arrivals: list[tuple[str, Priority, int, float]], now: float = 0.0, aging_s: float = 30.0) -> list[str]:
    """Push (party, class, weight, arrived) in order; pop everything at `now`: the parties served, in order."""
    queue = FairQueue(aging_s)
    for party, priority, weight, arrived in arrivals:
        queue.push(Entry(Schedule(party, priority, weight), 1, arrived))
    served = []
    while (entry := queue.peek(now)) is not None:
        queue.pop(entry)
        served.append(entry.schedule.party)
    return served


ORDER_CASES = [
    pytest.param([("a", N, 1, 0)] * 3, ["a"] * 3, id="one party: FIFO"),
    pytest.param(
        [("flood", N, 1, 0)] * 5 + [("quiet", N, 1, 1)],
        ["flood", "quiet", "flood", "flood", "flood", "flood"],
        id="a quiet party arriving after a flood goes next but one",
    ),
    pytest.param(
        [("a", N, 1, 0)] * 3 + [("b", N, 1, 0)] * 3,
        ["a", "b", "a", "b", "a", "b"],
        id="two busy parties alternate",
    ),
    pytest.param(
        [("heavy", N, 2, 0)] * 4 + [("light", N, 1, 0)] * 2,
        ["heavy", "light", "heavy", "heavy", "light", "heavy"],
        id="weight 2 gets two turns for one",
    ),
    pytest.param(
        [("n", N, 1, 0), ("l", L, 1, 0), ("h", H, 1, 1)],
        ["h", "n", "l"],
        id="strict classes: high, normal, low, whatever the arrival",
    ),
    pytest.param(
        [("h", H, 1, 0)] * 3 + [("n", N, 1, 0)],
        ["h", "h", "h", "n"],
        id="a flood of high delays normal (within the aging bound)",
    ),
]


@pytest.mark.parametrize(("arrivals", "served"), ORDER_CASES)
def test_queue_order(arrivals: list[tuple[str, Priority, int, float]], served: list[str]) -> None:
    assert _order(arrivals, now=1.0) == served


AGING_CASES = [
    # (own class, waited s, aging_s, effective rank)
    (L, 0.0, 30.0, 0),
    (L, 29.9, 30.0, 0),
    (L, 30.0, 30.0, 1),
    (L, 60.0, 30.0, 2),
    (L, 900.0, 30.0, 2),  # never above high
    (N, 30.0, 30.0, 2),
    (H, 0.0, 30.0, 2),
]


@pytest.mark.parametrize(("priority", "waited", "aging_s", "rank"), AGING_CASES)
def test_aging_moves_a_waiting_request_up_one_class_per_period(
    priority: Priority, waited: float, aging_s: float, rank: int
) -> None:
    entry = Entry(Schedule("p", priority), 1, arrived=100.0)
    assert effective_rank(entry, 100.0 + waited, aging_s) == rank


def test_an_aged_request_is_not_held_behind_a_fresh_one_of_its_class() -> None:
    # Low "old" has two requests in line since t=0; a fresh low caller arrives at 70 (its
    # start tag is the present: the class's fair-share head), a high request at 72. At 75
    # both old requests have aged to high and arrived first: they go before both.
    arrivals = [("old", L, 1, 0.0), ("old", L, 1, 0.0), ("fresh", L, 1, 70.0), ("h", H, 1, 72.0)]
    assert _order(arrivals, now=75.0) == ["old", "old", "h", "fresh"]


def test_a_low_request_waits_about_two_aging_periods_under_steady_high_and_low_traffic() -> None:
    """The reviewer's case: a high caller always has a request waiting, a low caller always
    has one from t=61 on, one turn a second: the low requests queued at t=0 still go by
    2×aging_s (before, the fresh low caller's request headed the class unaged, forever)."""
    queue, aging_s, now = FairQueue(30.0), 30.0, 0.0
    waits: dict[str, list[float]] = {"batch": [], "x": []}
    for _ in range(3):
        queue.push(Entry(Schedule("batch", L), 1, 0.0))
    queue.push(Entry(Schedule("h", H), 1, now))
    for _ in range(200):
        now += 1.0
        if now >= 62.0 and queue.held_by("x") == 0:
            queue.push(Entry(Schedule("x", L), 1, now))
        entry = queue.peek(now)
        assert entry is not None
        queue.pop(entry)
        if entry.schedule.party == "h":
            queue.push(Entry(Schedule("h", H), 1, now))
        else:
            waits[entry.schedule.party].append(now - entry.arrived)
    assert len(waits["batch"]) == 3 and max(waits["batch"]) <= 2 * aging_s + 3  # + the two before it
    assert len(waits["x"]) >= 2 and max(waits["x"]) <= 2 * aging_s + 1


def test_an_aged_low_request_overtakes_later_high_ones() -> None:
    arrivals = [("old-low", L, 1, 0.0)] + [("h", H, 1, t) for t in (10.0, 20.0, 30.0, 70.0)]
    # At t=75 the low request has waited 75 s ≥ 2×30: it competes as high, and arrived first.
    assert _order(arrivals, now=75.0) == ["old-low", "h", "h", "h", "h"]
    # Before its aging it waits behind every high request.
    assert _order(arrivals, now=5.0) == ["h", "h", "h", "h", "old-low"]


@pytest.mark.parametrize(("queue", "per_key", "cap"), [(64, None, 48), (4, None, 3), (2, None, 2), (1, None, 1),
                                                       (0, None, 0), (64, 10, 10), (4, 10, 4)])  # fmt: skip
def test_party_cap(queue: int, per_key: int | None, cap: int) -> None:
    assert party_cap(queue, per_key) == cap


def test_an_idle_party_is_forgotten_and_saves_no_credit() -> None:
    queue = FairQueue(30.0)
    first = Entry(Schedule("a"), 1, 0.0)
    queue.push(first)
    queue.pop(first)
    assert queue.held_by("a") == 0
    entries = [Entry(Schedule(p), 1, 0.0) for p in ("b", "b", "a")]
    for entry in entries:
        queue.push(entry)
    assert [e.start for e in entries] == [0.0, 1.0, 0.0]  # a starts at the present, not before it


async def test_a_flooding_caller_hits_its_own_cap_and_the_quiet_one_still_gets_a_place_and_goes_next() -> None:
    admission = Admission(turns=1, queue=4, model_id="m")
    flood, quiet = Schedule("flood"), Schedule("quiet")
    running = admission.admit(schedule=flood)
    flooded = [admission.admit(schedule=flood) for _ in range(3)]
    with pytest.raises(Overloaded, match="max_queue_per_key"):
        admission.admit(schedule=flood)
    waiting_quiet = admission.admit(schedule=quiet)  # the quarter left for others
    assert admission.waiting == 4
    running.done()
    await asyncio.sleep(0)
    flooded[0].done()  # the flood's first waiter went first (it was in line before quiet came)
    await waiting_quiet.wait_turn()  # quiet goes next, before the flood's two others
    assert all(ticket.turns == 0 for ticket in flooded[1:])
    for ticket in [waiting_quiet, *flooded]:
        ticket.done()
    assert (admission.running, admission.waiting) == (0, 0)


async def test_a_high_priority_caller_jumps_the_normal_line() -> None:
    admission = Admission(turns=1, queue=8, model_id="m")
    running = admission.admit(schedule=Schedule("n"))
    normal = [admission.admit(schedule=Schedule("n")) for _ in range(3)]
    high = admission.admit(schedule=Schedule("h", Priority.HIGH))
    assert admission.waiting_in(Priority.HIGH) == 1 and admission.waiting_in(Priority.NORMAL) == 3
    running.done()
    await high.wait_turn()
    assert all(ticket.turns == 0 for ticket in normal)
    for ticket in [high, *normal]:
        ticket.done()


async def test_low_priority_waits_until_aged_then_goes_before_later_normal_work() -> None:
    now = [0.0]
    admission = Admission(turns=1, queue=8, model_id="m", aging_s=10.0, clock=lambda: now[0])
    running = admission.admit(schedule=Schedule("n"))
    low = admission.admit(schedule=Schedule("batch", Priority.LOW))
    now[0] = 5.0
    normal = admission.admit(schedule=Schedule("n"))
    running.done()  # at t=5 low is still low: normal goes
    await normal.wait_turn()
    assert low.turns == 0
    later = admission.admit(schedule=Schedule("n"))
    now[0] = 11.0  # low has waited 11 s: it competes as normal, and it came before `later`
    normal.done()
    await low.wait_turn()
    assert later.turns == 0
    low.done()
    await later.wait_turn()
    later.done()
    assert (admission.running, admission.waiting) == (0, 0)


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("priority", "urgent", "priority must be one of high, normal, low (got 'urgent')"),
        ("priority", 5, "priority must be one of high, normal, low (got 5)"),
        ("weight", 0, "weight must be a whole number from 1 to 1000 (got 0)"),
        ("weight", 1001, "weight must be a whole number from 1 to 1000 (got 1001)"),
        ("weight", 1.5, "weight must be a whole number from 1 to 1000 (got 1.5)"),
        ("weight", True, "weight must be a whole number from 1 to 1000 (got True)"),
    ],
)
def test_a_bad_priority_or_weight_is_a_config_error_naming_the_key(field: str, value: object, says: str) -> None:
    keys = [{"name": "ok", "key_env": "K0"}, {"name": "batch-bot", "key_env": "K1", field: value}]
    with pytest.raises(ConfigError) as caught:
        load_config(environ={}, cli={"enabled_models": [], "auth": {"keys": keys}})
    assert "api key 'batch-bot'" in str(caught.value) and says in str(caught.value)


@pytest.mark.parametrize(
    ("section", "value"), [("max_queue_per_key", 0), ("priority_aging_s", 0), ("priority_aging_s", -1)]
)
def test_out_of_bounds_queue_settings_are_config_errors(section: str, value: float) -> None:
    with pytest.raises(ConfigError, match=section):
        load_config(environ={}, cli={"models": {"m": {"backend": "fake", "source": "x", section: value}}})


def test_keys_sharing_a_name_share_one_class() -> None:
    keys = [{"name": "a", "key_env": "A1", "priority": "high"}, {"name": "a", "key_env": "A2"}]
    with pytest.raises(ValueError, match="same priority and weight"):
        AuthConfig.model_validate({"keys": keys})


async def test_the_pool_queues_by_the_call_options_schedule_and_reports_depth_per_class() -> None:
    """Through the pool: `CallOptions.schedule` (the Batch API's way in) sets the class; the
    depth per class shows on /metrics and in the model's status."""
    metrics = Metrics()
    pool = pool_of(fake_slot(FakeBackend(), "m1", metrics=metrics, max_concurrency=1, max_queue=8))
    holder = await pool.chat("m1", REQUEST)  # takes the only turn
    order: list[str] = []

    async def ask(name: str, priority: Priority) -> None:
        options = CallOptions(schedule=Schedule(name, priority))
        await collect(await pool.chat("m1", REQUEST, options))
        order.append(name)

    tasks = [asyncio.create_task(ask("batch", Priority.LOW)), asyncio.create_task(ask("user", Priority.NORMAL))]
    slot = pool.slot("m1")
    await until(lambda: slot.admission.waiting == 2, "both to queue")
    assert slot.status().queued_by_priority == {"high": 0, "normal": 1, "low": 1}
    scraped = metrics.render().decode()
    assert 'modelpool_queued_requests{model="m1",priority="low"} 1.0' in scraped
    assert 'modelpool_queued_requests{model="m1",priority="high"} 0.0' in scraped
    await holder.aclose()
    await asyncio.gather(*tasks)
    assert order == ["user", "batch"]


@pytest.mark.parametrize(
    ("section", "field", "value"),
    [
        ("pool", "swap_after_s", -1),
        ("pool", "swap_after_s", 3601),
        ("auth", "unauthenticated_scheduling", {"weight": 0}),
        ("auth", "unauthenticated_scheduling", {"priority": "urgent"}),
    ],
)
def test_out_of_bounds_pool_and_anonymous_settings_are_config_errors(section: str, field: str, value: object) -> None:
    with pytest.raises(ConfigError, match=field):
        load_config(environ={}, cli={"enabled_models": [], section: {field: value}})


def test_a_reload_keeps_every_queue_setting_and_takes_a_new_aging_pace() -> None:
    slot = fake_slot(FakeBackend(), "m", max_queue=8, max_queue_per_key=2, priority_aging_s=5.0)
    assert (slot.admission.per_key, slot.admission.aging_s) == (2, 5.0)
    slot.retune(slot.config.model_copy(update={"max_queue": 16}))  # a hot change of another setting
    assert (slot.admission.queue, slot.admission.per_key, slot.admission.aging_s) == (16, 2, 5.0)
    slot.retune(slot.config.model_copy(update={"max_queue_per_key": 3, "priority_aging_s": 60.0}))
    assert (slot.admission.per_key, slot.admission.aging_s) == (3, 60.0)


async def test_a_reconfigured_model_ages_its_queue_at_the_new_pace() -> None:
    slot = fake_slot(FakeBackend(), "m", priority_aging_s=5.0)
    await slot.reconfigure(slot.config.model_copy(update={"priority_aging_s": 90.0}), slot.capabilities)
    assert slot.admission.aging_s == 90.0
