"""The pool's memory as Prometheus gauges, read from the same report `/v1/admin/memory`
gives, once per scrape (a collector, so nothing goes stale between scrapes)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from modelpool.status import PoolMemory


class MemoryGauges(Collector):
    def __init__(self, report: Callable[[], PoolMemory]) -> None:
        self._report = report

    def collect(self) -> Iterator[Metric]:
        memory = self._report()
        process = memory.process
        if process is not None:
            for name, value, text in (
                ("modelpool_process_resident_bytes", process.rss_bytes, "modelpool's resident memory (RSS)."),
                ("modelpool_process_baseline_bytes", process.baseline_bytes, "RSS when the pool was built."),
                ("modelpool_memory_unattributed_bytes", process.unattributed_bytes,
                 "Growth since the baseline that is neither a runtime's nor a loaded model's."),
            ):  # fmt: skip
                yield GaugeMetricFamily(name, text, value=value)
        runtimes = GaugeMetricFamily(
            "modelpool_runtime_memory_bytes", "What each runtime's first import cost, counted once.", labels=["runtime"]
        )
        for runtime, size in memory.runtimes.items():
            runtimes.add_metric([runtime], size)
        yield runtimes
        yield self._models(memory)
        yield self._budgets(memory)
        if memory.gpus:
            yield from self._gpus(memory)

    @staticmethod
    def _gpus(memory: PoolMemory) -> Iterator[Metric]:
        """Each GPU's memory as NVML counts it, and each model replica's measured use (its
        engine processes by PID, or an in-process load's share), with where it came from."""
        gpus = GaugeMetricFamily(
            "modelpool_gpu_memory_bytes",
            "Each GPU's memory: total, used (by anyone), free and reserved (by the driver).",
            labels=["device", "name", "kind"],
        )  # fmt: skip
        for gpu in memory.gpus:
            kinds = (("total", gpu.total_bytes), ("used", gpu.used_bytes), ("free", gpu.free_bytes),
                     ("reserved", gpu.reserved_bytes))  # fmt: skip
            for kind, value in kinds:
                gpus.add_metric([gpu.device, gpu.name, kind], value)
        yield gpus
        replicas = GaugeMetricFamily(
            "modelpool_model_gpu_memory_bytes",
            "Each model replica's measured GPU memory: `nvml` (its engine processes), `load` (in process).",
            labels=["model", "replica", "source"],
        )
        for model in memory.gpu_models:
            for replica in model.replicas:
                replicas.add_metric([model.model, str(replica.replica), replica.source], replica.measured_bytes)
        yield replicas

    @staticmethod
    def _models(memory: PoolMemory) -> Metric:
        family = GaugeMetricFamily(
            "modelpool_model_memory_bytes",
            "Each model's memory: measured, counted by the budget, estimated; on the RAM or the GPU.",
            labels=["model", "kind", "device"],
        )
        for model, m in memory.models.items():
            for kind, ram, gpu in (
                ("measured", m.measured_bytes, m.measured_gpu_bytes),
                ("counted", m.memory_bytes, m.gpu_memory_bytes),
                ("estimated", m.estimate_bytes, m.estimate_gpu_bytes),
            ):
                if ram is not None:
                    family.add_metric([model, kind, "ram"], ram)
                if gpu is not None and memory.gpu is not None:
                    family.add_metric([model, kind, "gpu"], gpu)
        return family

    @staticmethod
    def _budgets(memory: PoolMemory) -> Metric:
        family = GaugeMetricFamily(
            "modelpool_memory_budget_bytes",
            "The memory budgets: all of it, and what is left for models after the baseline and runtimes.",
            labels=["device", "part"],
        )
        budget = memory.budget
        for device, whole, models in (
            ("ram", budget.memory_bytes, budget.models_memory_bytes),
            ("gpu", budget.gpu_memory_bytes, budget.models_gpu_memory_bytes),
        ):
            if whole is not None:
                family.add_metric([device, "total"], whole)
            if models is not None:
                family.add_metric([device, "models"], models)
        return family
