"""The restart policy for engine processes that crash: a row of crashes, the backoff
before the next start (doubling with the row), and giving up after `max_restarts`."""

from __future__ import annotations

from dataclasses import dataclass, field

from modelpool.config.schema import ModelConfig
from modelpool.errors import ModelLoadFailed

STABLE_RUN_S = 60.0
"""An engine process that ran this long before crashing ends a row of crashes."""


@dataclass
class CrashRecord:
    in_a_row: int = 0
    last_output: list[str] = field(default_factory=list)
    """The last output lines of the process that crashed last."""

    def crashed(self, ran_for_s: float, output: list[str]) -> None:
        self.in_a_row = self.in_a_row + 1 if ran_for_s < STABLE_RUN_S else 1
        self.last_output = output

    def restart_delay(self, config: ModelConfig, since_crash_s: float, error: str | None) -> float:
        """Seconds the next start still waits; ModelLoadFailed once the row is too long."""
        if self.in_a_row > config.max_restarts:
            raise ModelLoadFailed(
                f"model '{config.id}' crashed {self.in_a_row} times in a row, so modelpool stopped restarting it "
                f"(`modelpool load {config.id}` tries again). Last crash: {error}",
                retry_after_s=60,
            )
        backoff = config.restart_backoff_s * 2.0 ** (self.in_a_row - 1)
        return max(0.0, backoff - since_crash_s)
