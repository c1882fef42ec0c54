"""The key middleware names each request's place in the queues (`owner.caller_schedule`):
a key's priority and weight with its name as the party; without keys, the client address."""

from __future__ import annotations

from typing import Any

from modelpool.config.schema import AuthConfig
from modelpool.owner import Priority, Schedule, caller_schedule
from modelpool.pool_api.call import CallOptions
from modelpool.server.auth import KeyRing, RequireKeys


async def _schedule_seen(keys: KeyRing, headers: list[tuple[bytes, bytes]], client: str) -> Schedule:
    seen: list[Schedule] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(CallOptions().schedule)  # what a route's CallOptions carries
        assert caller_schedule() == seen[0]

    scope = {"type": "http", "path": "/v1/chat/completions", "headers": headers, "client": (client, 5000)}
    await RequireKeys(app, keys)(scope, None, None)  # type: ignore[arg-type]
    return seen[0]


async def test_a_keys_priority_and_weight_reach_the_call_options() -> None:
    auth = AuthConfig.model_validate({"keys": [{"name": "vip", "key_env": "VIP", "priority": "high", "weight": 3}]})
    keys = KeyRing.from_config(auth, {"VIP": "sk-vip"})
    seen = await _schedule_seen(keys, [(b"authorization", b"Bearer sk-vip")], "10.0.0.1")
    assert seen == Schedule("vip", Priority.HIGH, 3)
    assert caller_schedule() == Schedule()  # outside the request: the library's default


async def test_without_keys_each_address_is_its_own_party_in_the_configured_class() -> None:
    auth = AuthConfig.model_validate({"unauthenticated_scheduling": {"priority": "low", "weight": 2}})
    keys = KeyRing.from_config(auth, {})
    assert await _schedule_seen(keys, [], "10.0.0.1") == Schedule("address 10.0.0.1", Priority.LOW, 2)
    assert (await _schedule_seen(keys, [], "10.0.0.2")).party == "address 10.0.0.2"
