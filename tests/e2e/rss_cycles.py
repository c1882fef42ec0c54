"""Run as a script: load and unload the embedding model N times in a fresh process and
print the process RSS around each cycle as JSON (used by test_memory.py)."""

from __future__ import annotations

import asyncio
import json
import sys

from modelpool.config import load_config
from modelpool.inference import EmbeddingRequest
from modelpool.runtime.build import build_pool
from modelpool.runtime.memory import process_rss

MODEL = "all-minilm-l6-v2"


async def cycles(count: int) -> list[dict[str, int]]:
    config = load_config(environ={}, cli={"enabled_models": [MODEL], "models": {MODEL: {"preload": False}}})
    pool = build_pool(config)
    readings = []
    for _ in range(count):
        before = process_rss()
        await pool.embed(MODEL, EmbeddingRequest(tuple(f"sentence {i} for the memory test" for i in range(64))))
        loaded = process_rss()
        await pool.unload(MODEL)
        readings.append({"before": before, "loaded": loaded, "unloaded": process_rss()})
    await pool.close()
    return readings


if __name__ == "__main__":
    print(json.dumps(asyncio.run(cycles(int(sys.argv[1])))))
