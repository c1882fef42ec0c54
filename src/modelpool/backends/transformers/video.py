"""Videos for the Qwen-VL families (Qwen2-VL, Qwen2.5-VL, Qwen3-VL) in the transformers
backend: the pool's sampled frames turned into the model's video inputs here, with numpy and
Pillow.

transformers' own video processors need torchvision (not a dependency of modelpool; see
docs/models.md), so this module does what Qwen's video processors do, with the model's
image processor's settings: each frame resized by Qwen's `smart_resize` within the image
processor's pixel bounds (bicubic), rescaled and normalised with its mean and std, the
frames grouped by `temporal_patch_size` (the last repeated to fill a group) and cut into the
same patch layout (`pixel_values_videos`, `video_grid_thw`). The prompt's video placeholder
becomes the model's video tokens: one run of `<|video_pad|>` per video for Qwen2-VL; for
Qwen3-VL one run per frame group, each after its timestamp (`<1.5 seconds>`), as
`Qwen3VLProcessor` writes them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
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
class PreparedVideos:
    pixel_values_videos: np.ndarray[Any, Any]
    video_grid_thw: np.ndarray[Any, Any]
    placeholders: tuple[str, ...]
    """What each video's placeholder in the prompt becomes."""


def prepare_videos(image_processor: Any, model_type: str, tokens: VideoTokens,
                   videos: Sequence[VideoInput]) -> PreparedVideos:  # fmt: skip
    patches, grids, placeholders = [], [], []
    merge = int(image_processor.merge_size)
    for video in videos:
        try:
            frames = _normalised(image_processor, video.frames)
        except ValueError as exc:  # Qwen's resizing refuses a size (an aspect ratio over 200, ...)
            raise InvalidRequest(f"the model cannot take this video: {exc}", param=video.param) from None
        flat, grid = _patchify(frames, int(image_processor.patch_size), merge, int(image_processor.temporal_patch_size))
        patches.append(flat)
        grids.append(grid)
        per_group = grid[1] * grid[2] // merge**2
        if model_type in TIMESTAMPED:
            times = _group_times(video.timestamps, int(image_processor.temporal_patch_size))
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


def _normalised(image_processor: Any, frames: Sequence[Any]) -> np.ndarray[Any, Any]:
    """(frames, channels, height, width), float32, resized to the model's grid and normalised."""
    from PIL import Image
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

    size = image_processor.size
    factor = int(image_processor.patch_size) * int(image_processor.merge_size)
    width, height = frames[0].size
    new_height, new_width = smart_resize(height, width, factor=factor, min_pixels=size.shortest_edge,
                                         max_pixels=size.longest_edge)  # fmt: skip
    mean = np.array(image_processor.image_mean, dtype=np.float32)[:, None, None]
    std = np.array(image_processor.image_std, dtype=np.float32)[:, None, None]
    scale = float(image_processor.rescale_factor)
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
