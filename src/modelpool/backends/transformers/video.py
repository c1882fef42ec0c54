"""Videos for the Qwen-VL families (Qwen2-VL, Qwen2.5-VL, Qwen3-VL) in the transformers
backend: the pool's sampled frames turned into the model's video inputs here, with numpy and
Pillow.

transformers' own video processors need torchvision (not a dependency of modelpool; see
docs/models.md), so this module does what Qwen's video processors do, with the settings of
the model's `video_preprocessor_config.json` (plain JSON; the image processor's only when a
folder has none): the frames resized by Qwen's `smart_resize` (bicubic) within the video's
pixel bounds — for Qwen3-VL over all of a video's frames together (t*h*w, as
`Qwen3VLVideoProcessor` bounds them), for Qwen2-VL and Qwen2.5-VL per frame — rescaled and
normalised with its mean and std, the
frames grouped by `temporal_patch_size` (the last repeated to fill a group) and cut into the
same patch layout (`pixel_values_videos`, `video_grid_thw`). The prompt's video placeholder
becomes the model's video tokens: one run of `<|video_pad|>` per video for Qwen2-VL; for
Qwen3-VL one run per frame group, each after its timestamp (`<1.5 seconds>`), as
`Qwen3VLProcessor` writes them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from modelpool.errors import InvalidRequest
from modelpool.inference import VideoInput

VIDEO_FAMILIES = frozenset({"qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe"})
"""Model types whose video inputs this module builds."""
TIMESTAMPED = frozenset({"qwen3_vl", "qwen3_vl_moe"})
"""Families that put each frame group's time in the prompt."""


@dataclass(frozen=True)
class VideoTokens:
    video: str
    vision_start: str
    vision_end: str


@dataclass(frozen=True)
class VideoSettings:
    """A model's video preprocessing settings (its `video_preprocessor_config.json`'s)."""

    patch_size: int
    merge_size: int
    temporal_patch_size: int
    min_pixels: int
    """`size.shortest_edge`: the fewest pixels (Qwen3-VL: of all frames together; else one frame's)."""
    max_pixels: int
    """`size.longest_edge`: the most pixels, counted as `min_pixels` is."""
    image_mean: tuple[float, float, float]
    image_std: tuple[float, float, float]
    rescale_factor: float
    cap_pixels_per_frame: bool = False
    """Qwen's optional per-frame cap (qwen-vl-utils' rule; transformers leaves it off by default)."""
    max_video_tokens: int = 768


def video_settings(folder: Path, image_processor: Any) -> VideoSettings:
    """The settings of `folder`'s `video_preprocessor_config.json`, each one it lacks (or the
    whole file, when there is none) taken from the image processor, as transformers would."""
    config_file = folder / "video_preprocessor_config.json"
    config: dict[str, Any] = json.loads(config_file.read_text()) if config_file.is_file() else {}
    size = config.get("size") or {}
    min_pixels = config.get("min_pixels") or size.get("shortest_edge") or image_processor.size.shortest_edge
    max_pixels = config.get("max_pixels") or size.get("longest_edge") or image_processor.size.longest_edge

    def pick(name: str) -> Any:
        return config[name] if config.get(name) is not None else getattr(image_processor, name)

    return VideoSettings(
        patch_size=int(pick("patch_size")), merge_size=int(pick("merge_size")),
        temporal_patch_size=int(pick("temporal_patch_size")), min_pixels=int(min_pixels), max_pixels=int(max_pixels),
        image_mean=tuple(float(v) for v in pick("image_mean")),  # type: ignore[arg-type]
        image_std=tuple(float(v) for v in pick("image_std")),  # type: ignore[arg-type]
        rescale_factor=float(pick("rescale_factor")),
        cap_pixels_per_frame=bool(config.get("cap_pixels_per_frame") or False),
        max_video_tokens=int(config.get("max_video_tokens") or 768),
    )  # fmt: skip


def frame_size(settings: VideoSettings, model_type: str, frames: int, height: int, width: int) -> tuple[int, int]:
    """(height, width) a video's frames are resized to, by the rule of the family's own video
    processor (transformers' `Qwen3VLVideoProcessor.resize` / `Qwen2VLVideoProcessor.resize`)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as frame_resize
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import smart_resize as video_resize

    factor = settings.patch_size * settings.merge_size
    temporal = settings.temporal_patch_size
    max_pixels = settings.max_pixels
    if model_type in TIMESTAMPED:
        if settings.cap_pixels_per_frame:
            per_frame = max(min(settings.max_video_tokens * factor * factor, settings.max_pixels // frames),
                            int(settings.min_pixels * 1.05))  # fmt: skip
            max_pixels = per_frame * frames
        # Fewer frames than a group are padded to one group (Qwen's resize would refuse them).
        return tuple(video_resize(max(frames, temporal), height, width, temporal_factor=temporal, factor=factor,
                                  min_pixels=settings.min_pixels, max_pixels=max_pixels))  # fmt: skip
    if settings.cap_pixels_per_frame:
        total = int(settings.max_video_tokens * factor * factor * 0.9)
        max_pixels = max(min(max_pixels, total * temporal // frames), int(settings.min_pixels * 1.05))
    return tuple(frame_resize(height, width, factor=factor, min_pixels=settings.min_pixels,
                              max_pixels=max_pixels))  # fmt: skip


@dataclass(frozen=True)
class PreparedVideos:
    pixel_values_videos: np.ndarray[Any, Any]
    video_grid_thw: np.ndarray[Any, Any]
    placeholders: tuple[str, ...]
    """What each video's placeholder in the prompt becomes."""


def prepare_videos(settings: VideoSettings, model_type: str, tokens: VideoTokens,
                   videos: Sequence[VideoInput]) -> PreparedVideos:  # fmt: skip
    patches, grids, placeholders = [], [], []
    merge, temporal = settings.merge_size, settings.temporal_patch_size
    for video in videos:
        try:
            frames = _normalised(settings, model_type, video.frames)
        except ValueError as exc:  # Qwen's resizing refuses a size (an aspect ratio over 200, ...)
            raise InvalidRequest(f"the model cannot take this video: {exc}", param=video.param) from None
        flat, grid = _patchify(frames, settings.patch_size, merge, temporal)
        patches.append(flat)
        grids.append(grid)
        per_group = grid[1] * grid[2] // merge**2
        if model_type in TIMESTAMPED:
            times = _group_times(video.timestamps, temporal)
            placeholder = "".join(
                f"<{time:.1f} seconds>{tokens.vision_start}{tokens.video * per_group}{tokens.vision_end}"
                for time in times
            )
        else:
            placeholder = f"{tokens.vision_start}{tokens.video * (per_group * grid[0])}{tokens.vision_end}"
        placeholders.append(placeholder)
    return PreparedVideos(np.concatenate(patches), np.array(grids, dtype=np.int64), tuple(placeholders))


def expand_placeholders(text: str, tokens: VideoTokens, placeholders: Sequence[str]) -> str:
    """Each video's place in the rendered prompt (`<|vision_start|><|video_pad|><|vision_end|>`
    as Qwen's templates write it, or a bare `<|video_pad|>`) replaced, in order."""
    whole = f"{tokens.vision_start}{tokens.video}{tokens.vision_end}"
    for placeholder in placeholders:
        marker = whole if whole in text else tokens.video
        if marker not in text:
            raise ValueError("the chat template left no place for a video (no video token)")
        text = text.replace(marker, placeholder, 1)
    return text


def _normalised(settings: VideoSettings, model_type: str, frames: Sequence[Any]) -> np.ndarray[Any, Any]:
    """(frames, channels, height, width), float32, resized to the model's grid and normalised."""
    from PIL import Image

    width, height = frames[0].size
    new_height, new_width = frame_size(settings, model_type, len(frames), height, width)
    mean = np.array(settings.image_mean, dtype=np.float32)[:, None, None]
    std = np.array(settings.image_std, dtype=np.float32)[:, None, None]
    scale = settings.rescale_factor
    out = []
    for frame in frames:
        resized = frame.convert("RGB").resize((new_width, new_height), Image.Resampling.BICUBIC)
        pixels = np.asarray(resized, dtype=np.float32).transpose(2, 0, 1) * scale
        out.append((pixels - mean) / std)
    return np.stack(out)


def _patchify(frames: np.ndarray[Any, Any], patch: int, merge: int, temporal: int
              ) -> tuple[np.ndarray[Any, Any], list[int]]:  # fmt: skip
    """Qwen's video patch layout: (groups * grid_h * grid_w, channels * temporal * patch * patch),
    patches ordered by group, then merge block (row, column), then within the block."""
    if pad := -len(frames) % temporal:
        frames = np.concatenate([frames, np.repeat(frames[-1:], pad, axis=0)])
    count, channels, height, width = frames.shape
    grid_t, grid_h, grid_w = count // temporal, height // patch, width // patch
    blocks = frames.reshape(grid_t, temporal, channels, grid_h // merge, merge, patch, grid_w // merge, merge, patch)
    ordered = blocks.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
    flat = ordered.reshape(grid_t * grid_h * grid_w, channels * temporal * patch * patch)
    return np.ascontiguousarray(flat), [grid_t, grid_h, grid_w]


def _group_times(timestamps: Sequence[float], temporal: int) -> list[float]:
    """Each frame group's time: the mean of its first and last frame's (Qwen3-VL's rule)."""
    times = list(timestamps)
    if pad := -len(times) % temporal:
        times += [times[-1]] * pad
    return [(times[i] + times[i + temporal - 1]) / 2 for i in range(0, len(times), temporal)]
