"""How many live transcription sessions may open: all keys together, and per named key
(the anonymous caller of a server without keys is bound by the total only)."""

from __future__ import annotations

from modelpool.api.routes.realtime import RealtimeStats
from modelpool.config.schema import ServerConfig

SERVER = ServerConfig(realtime_sessions=3, realtime_sessions_per_key=2)


def test_sessions_are_bounded_in_all_and_per_key() -> None:
    stats = RealtimeStats(queue_bound=8)
    stats.opened("alice")
    stats.opened("alice")
    refused = stats.refusal("alice", SERVER)
    assert refused is not None and "realtime_sessions_per_key" in refused
    assert stats.refusal("bob", SERVER) is None
    stats.opened(None)  # no keys: counted in the total only
    refused = stats.refusal("bob", SERVER)
    assert refused is not None and "server.realtime_sessions)" in refused
    stats.closed("alice")
    assert stats.refusal("alice", SERVER) is None and stats.by_key == {"alice": 1}
    stats.closed("alice")
    stats.closed(None)
    assert (stats.open_sessions, stats.by_key) == (0, {})  # a key with no session left is forgotten
