"""A load generator for any OpenAI-compatible server (ours, vLLM, llama-server, OpenAI).

The core of `modelpool bench` and of the side-by-side benchmarks in `benchmarks/`. Like the
SDK (`modelpool.client`) it imports nothing of the server: it speaks HTTP only, through
httpx, a connection per request in flight.

- `spec`: what to send (`LoadSpec`) and how much (`LoadPlan`), with their bounds;
- `requests`: one request of each kind, timed (`RequestRecord`);
- `runner`: concurrency levels, warm-up, a request count or a duration;
- `stats`: percentiles and the summary of one level;
- `report`, `chart`: the table, the JSON file, the SVG/PNG chart.
"""

from modelpool.loadgen.records import RequestRecord
from modelpool.loadgen.runner import Clients, LevelRun, open_client, run_batch, run_level, run_sweep
from modelpool.loadgen.spec import KINDS, Kind, LoadPlan, LoadSpec, LoadSpecError
from modelpool.loadgen.stats import LevelSummary, percentile, summarize

__all__ = [
    "KINDS",
    "Clients",
    "Kind",
    "LevelRun",
    "LevelSummary",
    "LoadPlan",
    "LoadSpec",
    "LoadSpecError",
    "RequestRecord",
    "open_client",
    "percentile",
    "run_batch",
    "run_level",
    "run_sweep",
    "summarize",
]
