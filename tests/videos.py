"""Small test videos made with PyAV: solid-colour frames, in a real container and codec."""

from __future__ import annotations

import io
from collections.abc import Sequence

from PIL import Image


def make_video(
    colors: Sequence[str],
    *,
    fps: int = 4,
    size: tuple[int, int] = (64, 64),
    container: str = "mp4",
    codec: str = "mpeg4",
) -> bytes:
    """One frame per colour, `fps` frames a second."""
    import av

    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format=container) as output:
        stream = output.add_stream(codec, rate=fps)
        assert isinstance(stream, av.VideoStream)
        stream.width, stream.height = size
        stream.pix_fmt = "yuv420p"
        for color in colors:
            frame = av.VideoFrame.from_image(Image.new("RGB", size, color))
            for packet in stream.encode(frame):
                output.mux(packet)
        for packet in stream.encode():
            output.mux(packet)
    return buffer.getvalue()
