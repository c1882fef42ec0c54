"""Unloading really frees memory: the process RSS comes back down after each unload and
does not creep up over repeated load/unload cycles (measured in a fresh process)."""

from __future__ import annotations

import json
import subprocess
import sys

MiB = 1024 * 1024
GROWTH_BOUND = 40 * MiB  # over 5 more load/unload cycles after the first


def test_load_unload_cycles_give_the_memory_back() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "tests.e2e.rss_cycles", "6"], capture_output=True, text=True, timeout=300, check=True
    )
    readings = json.loads(result.stdout.strip().splitlines()[-1])
    first, last = readings[0], readings[-1]
    report = ", ".join(
        f"#{i}: {r['before'] // MiB}→{r['loaded'] // MiB}→{r['unloaded'] // MiB} MiB" for i, r in enumerate(readings)
    )
    print(f"\nRSS before→loaded→unloaded per cycle: {report}")
    growth = last["unloaded"] - first["unloaded"]
    assert growth < GROWTH_BOUND, f"RSS grew {growth // MiB} MiB over 5 cycles: {report}"
    for reading in readings[1:]:  # the first cycle also imports torch, which stays
        held = reading["loaded"] - reading["before"]
        freed = reading["loaded"] - reading["unloaded"]
        assert held > 20 * MiB, report  # loading shows up in RSS at all
        assert freed > 0.5 * held, f"an unload gave back only {freed // MiB} of {held // MiB} MiB: {report}"
