"""A pool built from the config: every served model's capabilities resolved and its options
checked before anything loads, so a bad config fails at start, not at the first request."""

from __future__ import annotations

import logging
from dataclasses import replace

from modelpool.backends.base import Backend
from modelpool.backends.context import BackendContext, ClaimedProcesses
from modelpool.backends.registry import build_backend, model_capabilities
from modelpool.capabilities import ModelCapabilities
from modelpool.config.schema import Config, ModelConfig
from modelpool.config.sources import HubLocation
from modelpool.media.images import ImagePolicy
from modelpool.media.video import VideoPolicy
from modelpool.runtime.capacity import Capacity
from modelpool.runtime.clock import Clock, SystemClock
from modelpool.runtime.eviction import Budget
from modelpool.runtime.gpu_probe import probe_gpus
from modelpool.runtime.machine import MachineMemory, machine_memory
from modelpool.runtime.memory_accounts import MemoryAccounts
from modelpool.runtime.memory_budget import resolve_budgets, startup_lines
from modelpool.runtime.metrics.memory_gauges import MemoryGauges
from modelpool.runtime.metrics.prometheus import Metrics
from modelpool.runtime.pool import ModelPool
from modelpool.runtime.slot import ModelSlot

log = logging.getLogger("modelpool.runtime")


def build_pool(
    config: Config,
    *,
    metrics: Metrics | None = None,
    clock: Clock | None = None,
    accounts: MemoryAccounts | None = None,
    machine: MachineMemory | None = None,
) -> ModelPool:
    """`accounts` and `machine` are injectable: tests give a fake GPU probe or machine size."""
    metrics = metrics or Metrics()
    clock = clock or SystemClock()
    hub = HubLocation(config.hf_cache_dir, config.offline, config.work_dir or HubLocation.work_dir, config.state_dir)
    claimed = ClaimedProcesses()
    accounts = accounts or MemoryAccounts()  # the baseline: the process as the pool is built
    budgets = resolve_budgets(config.pool, machine or machine_memory(), accounts.gpus_at_start)
    for line in startup_lines(budgets):
        log.info(line)
    budget = Budget(
        max_models=config.pool.max_loaded_models, memory_bytes=budgets.ram_bytes, gpu_bytes=budgets.gpu_bytes
    )
    # A config reload may add and remove models: capacity asks the pool for its slots then.
    capacity = Capacity(budget, lambda: pool.resident_slots(), accounts, swap_after_s=config.pool.swap_after_s)
    capacity.budget_from = (budgets.ram_from, budgets.gpu_from)

    def make(cfg: ModelConfig) -> Backend:
        return build_backend(cfg, BackendContext(hub, model_capabilities(cfg).tasks, claimed, probe_gpus))

    def new_slot(model: ModelConfig, capabilities: ModelCapabilities) -> ModelSlot:
        return ModelSlot(model, capabilities, make, metrics, clock, capacity, hub, accounts)

    slots: list[ModelSlot] = []
    for model in config.served_models():
        with accounts.side_imports():  # a backend class may import its runtime (torch) here
            capabilities = model_capabilities(model)
        slots.append(new_slot(model, capabilities))
    pool = ModelPool(
        slots,
        metrics,
        capacity,
        clock,
        model_wait_s=config.server.model_wait_s,
        resolve=model_capabilities,
        reap_interval_s=config.pool.reap_interval_s,
        reload_wait_s=config.pool.reload_wait_s,
        images=image_policy(config),
        videos=video_policy(config),
        max_audio_seconds=config.server.max_audio_seconds,
        audio_budget_s=config.server.audio_budget_seconds,
        default_models=config.defaults.models,
    )
    pool.new_slot = new_slot
    metrics.registry.register(MemoryGauges(pool.memory))
    return pool


def video_policy(config: Config) -> VideoPolicy:
    """Videos come from where images do; their own limits on size, length and resolution."""
    server = config.server
    source = replace(image_policy(config), max_bytes=server.max_video_bytes, kind="video",
                     bytes_setting="server.max_video_bytes")  # fmt: skip
    return VideoPolicy(source=source, max_seconds=server.max_video_seconds, max_frame_pixels=server.max_video_pixels,
                       max_videos=server.max_videos_per_request,
                       max_frames_pixels=server.max_request_image_pixels)  # fmt: skip


def image_policy(config: Config) -> ImagePolicy:
    server = config.server
    return ImagePolicy(
        allow_remote=server.allow_remote_images,
        allowed_hosts=frozenset(server.image_fetch_allowed_hosts),
        local_dirs=tuple(server.allowed_local_media_dirs),
        max_bytes=server.max_image_bytes,
        max_pixels=server.max_image_pixels,
        max_images=server.max_images_per_request,
        max_request_pixels=server.max_request_image_pixels,
        fetch_timeout_s=server.image_fetch_timeout_s,
    )
