"""Videos from `video_url` parts: header checks before any frame is decoded, frame sampling
within its bounds, decode-time bounds for files whose headers say too little, and Qwen's
video patch layout as transformers' own video processor builds it."""

from __future__ import annotations

import base64
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from modelpool.errors import InvalidRequest, RequestTooLarge
from modelpool.inference import VideoInput
from modelpool.media import video as video_module
from modelpool.media.images import ImagePolicy
from modelpool.media.video import Sampling, VideoPolicy, read_header, sample_frames, video_bytes
from tests.videos import make_video

PART = "messages[0].content[1]"
COLORS = {"red": (255, 0, 0), "green": (0, 128, 0), "blue": (0, 0, 255), "yellow": (255, 255, 0)}


def color_of(frame: Image.Image) -> str:
    pixel = np.asarray(frame.getpixel((4, 4)), dtype=float)
    return min(COLORS, key=lambda name: float(np.abs(pixel - COLORS[name]).sum()))


def test_the_header_is_read_and_checked_before_decoding() -> None:
    header = read_header(make_video(["red"] * 8, fps=4), VideoPolicy(), PART)
    assert (header.width, header.height, header.seconds, header.mime) == (64, 64, 2.0, "video/mp4")
    webm = read_header(make_video(["red"] * 3, container="webm", codec="libvpx-vp9"), VideoPolicy(), PART)
    assert webm.mime == "video/webm"
    with pytest.raises(RequestTooLarge, match=r"4096x4096, over 1000000 pixels a frame \(server.max_video_pixels\)"):
        read_header(make_video(["red"], size=(4096, 4096)), VideoPolicy(max_frame_pixels=1_000_000), PART)
    with pytest.raises(InvalidRequest, match=r"4200x16: its aspect ratio is over 200:1") as caught:
        read_header(make_video(["red"], size=(4200, 16)), VideoPolicy(), PART)
    assert caught.value.param == PART
    with pytest.raises(RequestTooLarge, match=r"40 s long, over 10 s \(server.max_video_seconds\)"):
        read_header(make_video(["red"] * 40, fps=1), VideoPolicy(max_seconds=10), PART)


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (b"garbage" * 20, "cannot be read"),
        (b"", "cannot be read"),
        (make_video(["red"] * 4)[:300], "video"),
        (b"GIF89a" + bytes(40), "video"),
    ],
    ids=["garbage", "empty", "truncated", "gif-header"],
)
def test_bad_files_are_the_requests_400(data: bytes, words: str) -> None:
    with pytest.raises(InvalidRequest, match=words) as caught:
        sample_frames(data, VideoPolicy(), Sampling(2.0, 8), PART)
    assert caught.value.param == PART and caught.value.status_code == 400


def test_an_image_is_not_a_video() -> None:
    png = Image.new("RGB", (8, 8), "red")
    import io

    buffer = io.BytesIO()
    png.save(buffer, format="PNG")
    with pytest.raises(InvalidRequest, match="video format png_pipe is not supported"):
        read_header(buffer.getvalue(), VideoPolicy(), PART)


def test_frames_are_sampled_at_the_rate_and_spread_when_the_video_is_longer() -> None:
    half_and_half = make_video(["red"] * 4 + ["blue"] * 4, fps=4)  # 2 s
    sampled = sample_frames(half_and_half, VideoPolicy(), Sampling(2.0, 8), PART)
    assert sampled.timestamps == (0.0, 0.5, 1.0, 1.5) and sampled.fps == 4.0
    assert [color_of(f) for f in sampled.frames] == ["red", "red", "blue", "blue"]
    cycle = make_video(["red", "green", "blue", "yellow"] * 10, fps=4)  # 10 s: 20 frames at 2 fps, 4 kept
    spread = sample_frames(cycle, VideoPolicy(), Sampling(2.0, 4), PART)
    assert spread.timestamps == (0.0, 2.5, 5.0, 7.5)
    assert [color_of(f) for f in spread.frames] == ["red", "blue", "red", "blue"]  # frames 0, 10, 20, 30


def test_without_a_declared_length_frames_stay_within_the_bound_and_evenly_spread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(video_module, "_declared_seconds", lambda container, stream: None)
    sampled = sample_frames(make_video(["red"] * 40, fps=4), VideoPolicy(), Sampling(4.0, 6), PART)
    assert len(sampled.frames) <= 6
    gaps = set(np.diff(sampled.timestamps).round(3))
    assert len(gaps) == 1  # evenly spread over what was decoded


def test_a_stream_running_past_its_bound_is_stopped_while_decoding(monkeypatch: pytest.MonkeyPatch) -> None:
    """A header that says nothing (or lies) about the length does not get the whole file decoded."""
    monkeypatch.setattr(video_module, "_declared_seconds", lambda container, stream: None)
    with pytest.raises(RequestTooLarge, match=r"runs past 3 s \(server.max_video_seconds\)"):
        sample_frames(make_video(["red"] * 40, fps=4), VideoPolicy(max_seconds=3), Sampling(2.0, 8), PART)


def test_frames_are_scaled_down_to_the_request_pixel_budget() -> None:
    data = make_video(["red"] * 4, size=(640, 480), fps=4)
    sampled = sample_frames(data, VideoPolicy(max_frames_pixels=4 * 160 * 120), Sampling(4.0, 4), PART)
    assert all(f.size[0] * f.size[1] <= 160 * 120 for f in sampled.frames)
    assert abs(sampled.frames[0].size[0] / sampled.frames[0].size[1] - 4 / 3) < 0.05


async def test_videos_come_from_where_images_may(tmp_path: Path) -> None:
    data = make_video(["red"] * 2)
    (tmp_path / "clip.mp4").write_bytes(data)
    source = ImagePolicy(local_dirs=(tmp_path,), max_bytes=len(data) + 3, kind="video",
                         bytes_setting="server.max_video_bytes")  # fmt: skip
    policy = VideoPolicy(source=source)
    assert await video_bytes((tmp_path / "clip.mp4").as_uri(), policy, PART) == data
    uri = f"data:video/mp4;base64,{base64.b64encode(data).decode()}"
    assert await video_bytes(uri, policy, PART) == data
    small = VideoPolicy(source=ImagePolicy(max_bytes=10, kind="video", bytes_setting="server.max_video_bytes"))
    with pytest.raises(RequestTooLarge, match=r"the video is over 10 bytes \(server.max_video_bytes\)"):
        await video_bytes(uri, small, PART)
    with pytest.raises(InvalidRequest, match="remote video URLs are off"):
        await video_bytes("https://example.com/a.mp4", policy, PART)
    with pytest.raises(InvalidRequest, match="file:// videos are allowed only under"):
        await video_bytes("file:///etc/hostname", policy, PART)


def test_qwen_video_patches_equal_transformers_video_processors_layout() -> None:
    """`_patchify` against Qwen3-VL's own video processor's (torch; its resizing needs
    torchvision, its patch layout does not)."""
    import torch
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    from modelpool.backends.transformers.video import _group_times, _patchify

    frames = np.random.default_rng(0).standard_normal((3, 3, 64, 96)).astype(np.float32)  # 3 frames: one padded
    ours, grid = _patchify(frames, patch=16, merge=2, temporal=2)
    theirs, *their_grid = Qwen3VLVideoProcessor.patchify(
        None,  # type: ignore[arg-type]  # it reads nothing from self
        torch.from_numpy(frames)[None], patch_size=16, merge_size=2, temporal_patch_size=2,
    )  # fmt: skip
    assert grid == their_grid == [2, 4, 6]
    assert np.array_equal(ours, theirs[0].numpy())
    assert _group_times([0.0, 0.5, 1.0], 2) == [0.25, 1.0]


@pytest.mark.parametrize(
    "server",
    [{"max_video_seconds": 0}, {"max_video_bytes": 3 * 1024**3}, {"max_video_pixels": -1},
     {"max_videos_per_request": 0}],
    ids=["seconds", "bytes", "pixels", "count"],
)
def test_out_of_bounds_video_settings_are_config_errors(server: dict[str, int]) -> None:
    from modelpool.config.loader import load_config
    from modelpool.errors import ConfigError

    with pytest.raises(ConfigError, match=next(iter(server))):
        load_config(None, cli={"server": server}, environ={})


def test_a_transformers_video_model_declares_its_sampling_and_bounds_its_options() -> None:
    from pydantic import ValidationError

    from modelpool.backends.transformers.backend import TransformersBackend, TransformersOptions
    from modelpool.capabilities import Modality

    declared = TransformersBackend.capabilities_for(TransformersOptions(vision=True, video=True, video_fps=1.0))
    assert Modality.VIDEO in declared.modalities and (declared.video_fps, declared.max_video_frames) == (1.0, 32)
    images_only = TransformersBackend.capabilities_for(TransformersOptions(vision=True))
    assert Modality.VIDEO not in images_only.modalities and images_only.video_fps is None
    bad_options = ({"video_fps": 0}, {"video_fps": 31}, {"video_max_frames": 0}, {"device_map": "balanced"},
                   {"video": True})  # fmt: skip
    for bad in bad_options:
        with pytest.raises(ValidationError):
            TransformersOptions.model_validate(bad)


def test_engines_and_upstreams_declare_video_only_when_they_take_it() -> None:
    from modelpool.backends.managed.llama_server import LlamaServerBackend, LlamaServerOptions
    from modelpool.backends.managed.vllm_serve import VllmOptions, VllmServeBackend
    from modelpool.backends.remote.backend import OpenAIRemoteBackend, RemoteOptions
    from modelpool.capabilities import Modality

    vllm = VllmServeBackend.capabilities_for(VllmOptions(limit_mm_per_prompt={"image": 2, "video": 1}))
    assert {Modality.IMAGE, Modality.VIDEO} <= vllm.modalities and vllm.video_fps is None  # forwarded whole
    assert Modality.VIDEO not in VllmServeBackend.capabilities_for(VllmOptions()).modalities
    remote = OpenAIRemoteBackend.capabilities_for(RemoteOptions(base_url="http://up/v1", video=True))
    assert Modality.VIDEO in remote.modalities and remote.video_fps is None
    llama = LlamaServerBackend.capabilities_for(LlamaServerOptions(mmproj="/m/mmproj.gguf"))
    assert Modality.IMAGE in llama.modalities and Modality.VIDEO not in llama.modalities


def test_a_decode_that_takes_too_long_is_stopped() -> None:
    with pytest.raises(RequestTooLarge, match="decoding the video took longer than 0 s"):
        sample_frames(make_video(["red"] * 8), VideoPolicy(max_decode_s=0.0), Sampling(2.0, 8), PART)


def test_a_video_qwen_cannot_resize_is_the_parts_400() -> None:
    """The second guard behind the header's aspect-ratio check: Qwen's `smart_resize` refusing
    the frames' size is the request's 400 naming the part, not a 500."""
    from modelpool.backends.transformers.video import VideoSettings, VideoTokens, prepare_videos

    settings = VideoSettings(16, 2, 2, 64 * 64, 256 * 256, (0.5,) * 3, (0.5,) * 3, 1 / 255)
    strip = VideoInput(url="data:", param=PART, frames=(Image.new("RGB", (4200, 16)),), timestamps=(0.0,))
    tokens = VideoTokens("<|video_pad|>", "<|vision_start|>", "<|vision_end|>")
    with pytest.raises(InvalidRequest, match=r"cannot take this video: .*aspect ratio") as caught:
        prepare_videos(settings, "qwen3_vl", tokens, [strip])
    assert caught.value.param == PART


# Qwen3-VL's and Qwen2-VL's own video processors' defaults (transformers 5.x), as their
# checkpoints' video_preprocessor_config.json carry them.
QWEN3_VIDEO = {"size": {"shortest_edge": 128 * 32 * 32, "longest_edge": 32 * 32 * 768}, "patch_size": 16,
               "merge_size": 2, "temporal_patch_size": 2, "image_mean": [0.5] * 3, "image_std": [0.5] * 3,
               "rescale_factor": 1 / 255}  # fmt: skip
QWEN2_VIDEO = {"min_pixels": 128 * 28 * 28, "max_pixels": 28 * 28 * 768, "patch_size": 14, "merge_size": 2,
               "temporal_patch_size": 2, "image_mean": [0.48, 0.46, 0.41], "image_std": [0.27, 0.26, 0.28],
               "rescale_factor": 1 / 255}  # fmt: skip


@pytest.mark.parametrize(
    ("model_type", "config", "frames", "size", "grid", "tokens"),
    [
        # 8 frames 640x480: t*h*w = 2,457,600 > 786,432, beta = sqrt(3.125): 256x352 -> (4, 16, 22), 88 a group.
        ("qwen3_vl", QWEN3_VIDEO, 8, (640, 480), [4, 16, 22], 4 * 88),
        # 2 frames 64x64: 8,192 < 131,072, beta = 4: 256x256 -> (1, 16, 16), 64 tokens.
        ("qwen3_vl", QWEN3_VIDEO, 2, (64, 64), [1, 16, 16], 64),
        # Qwen2-VL bounds each frame: 640x480 is within, rounded to 28s: 476x644 -> (4, 34, 46), 391 a group.
        ("qwen2_vl", QWEN2_VIDEO, 8, (640, 480), [4, 34, 46], 4 * 391),
        # 64x64 under min_pixels: beta = sqrt(100352 / 4096) = 4.95: 336x336 -> (2, 24, 24), 144 a group.
        ("qwen2_vl", QWEN2_VIDEO, 3, (64, 64), [2, 24, 24], 2 * 144),
    ],
    ids=["qwen3-8-frames", "qwen3-2-small", "qwen2-8-frames", "qwen2-3-small"],
)
def test_qwen_video_grids_follow_the_models_video_processor(
    tmp_path: Path, model_type: str, config: dict[str, object], frames: int, size: tuple[int, int],
    grid: list[int], tokens: int,
) -> None:  # fmt: skip
    """The video's grid and token count by the family's video processor's rule, with its
    video_preprocessor_config.json's bounds (not the image processor's, which differ)."""
    import json
    from types import SimpleNamespace

    from modelpool.backends.transformers.video import VideoTokens, prepare_videos, video_settings

    (tmp_path / "video_preprocessor_config.json").write_text(json.dumps(config))
    image_processor = SimpleNamespace(size=SimpleNamespace(shortest_edge=1, longest_edge=10**9))  # never read
    settings = video_settings(tmp_path, image_processor)
    video = VideoInput("data:", PART, tuple(Image.new("RGB", size, "red") for _ in range(frames)),
                       tuple(i * 0.5 for i in range(frames)))  # fmt: skip
    pad = VideoTokens("P", "<", ">")
    prepared = prepare_videos(settings, model_type, pad, [video])
    assert prepared.video_grid_thw.tolist() == [grid]
    assert prepared.placeholders[0].count("P") == tokens


def test_without_a_video_config_the_image_processors_settings_are_used(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from modelpool.backends.transformers.video import video_settings

    image_processor = SimpleNamespace(size=SimpleNamespace(shortest_edge=100, longest_edge=1000), patch_size=14,
                                      merge_size=2, temporal_patch_size=2, image_mean=[0.5] * 3,
                                      image_std=[0.25] * 3, rescale_factor=0.5)  # fmt: skip
    settings = video_settings(tmp_path, image_processor)
    assert (settings.min_pixels, settings.max_pixels, settings.patch_size, settings.image_std) == (
        100, 1000, 14, (0.25, 0.25, 0.25))  # fmt: skip


async def test_images_and_videos_share_one_request_pixel_budget() -> None:
    """`server.max_request_image_pixels` bounds a request's images and its videos' frames
    together: the frames get what the images leave, split among the videos."""
    from modelpool.capabilities import Capabilities, Modality
    from modelpool.inference import ChatMessage, ChatRequest, ImageInput
    from modelpool.runtime.tasks.videos import with_loaded_videos

    declared = Capabilities(tasks=frozenset(), modalities=frozenset({Modality.TEXT, Modality.VIDEO}), video_fps=2.0,
                            max_video_frames=4)  # fmt: skip
    uri = "data:video/mp4;base64," + base64.b64encode(make_video(["red"] * 4, size=(320, 320))).decode()
    image = ImageInput("data:", "messages[0].content[0]", image=Image.new("RGB", (200, 200)))
    videos = tuple(VideoInput(uri, f"messages[0].content[{i}]") for i in (1, 2))
    request = ChatRequest(messages=(ChatMessage("user", "", parts=(image, *videos)),))
    policy = VideoPolicy(max_frames_pixels=200_000)
    loaded = await with_loaded_videos(request, "m", declared, policy)
    assert all(video.frames for video in loaded.messages[0].videos)
    frames = [frame for video in loaded.messages[0].videos for frame in video.frames]
    # 200,000 - 40,000 image pixels, 80,000 a video, 20,000 a frame: 141x141, not 223x223 (the whole budget's).
    assert all(frame.width * frame.height <= 20_000 for frame in frames), [frame.size for frame in frames]
    crowded = ChatRequest(messages=(ChatMessage("user", "", parts=(
        ImageInput("data:", "messages[0].content[0]", image=Image.new("RGB", (440, 440))), *videos)),))  # fmt: skip
    with pytest.raises(RequestTooLarge, match=r"server\.max_request_image_pixels") as caught:
        await with_loaded_videos(crowded, "m", declared, policy)
    assert caught.value.param == "messages[0].content[1]"
