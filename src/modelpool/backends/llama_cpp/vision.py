"""Images for an in-process llama.cpp model: a GGUF vision projector (`mmproj`) through
libmtmd, as llama-cpp-python binds it.

The prompt is rendered with the model's own chat template, an image part becoming
libmtmd's media marker; libmtmd splits it into text and image chunks, and each chunk is
evaluated into the context (an image as its projected embeddings). Generation then goes on
from there, with every option a text prompt has (sampling, stops, logprobs, grammars).
Everything here runs on the engine thread, which owns the llama.cpp context.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from modelpool.backends.llama_knobs import FLASH_ATTN_TYPE
from modelpool.errors import GenerationFailed, InvalidRequest, ModelLoadFailed

if TYPE_CHECKING:
    from modelpool.backends.llama_cpp.model import GgufModel


class ImageProjector:
    def __init__(
        self,
        model: GgufModel,
        path: str,
        *,
        n_threads: int,
        use_gpu: bool,
        model_id: str,
        image_tokens: tuple[int | None, int | None] = (None, None),
        flash_attention: str = "auto",
    ) -> None:
        import llama_cpp.mtmd_cpp as mtmd

        self._mtmd = mtmd
        params = mtmd.mtmd_context_params_default()
        params.use_gpu = use_gpu
        params.print_timings = False
        params.n_threads = n_threads
        params.flash_attn_type = FLASH_ATTN_TYPE[flash_attention]
        # The image-token budget of projectors with dynamic resolution (-1: the projector's own).
        params.image_min_tokens, params.image_max_tokens = (-1 if n is None else n for n in image_tokens)
        context = mtmd.mtmd_init_from_file(path.encode(), model.model, params)
        if not context:
            raise ModelLoadFailed(f"model '{model_id}': llama.cpp could not load the projector {path}")
        if not mtmd.mtmd_support_vision(context):
            mtmd.mtmd_free(context)
            raise ModelLoadFailed(f"model '{model_id}': the projector {path} has no vision encoder")
        self._context = context
        self.marker = mtmd.mtmd_default_marker().decode("utf-8")
        """What an image part becomes in the rendered prompt."""

    def close(self) -> None:
        if self._context:
            self._mtmd.mtmd_free(self._context)
            self._context = None

    def tokenize(self, prompt: ImagePrompt) -> MediaChunks:
        """libmtmd's split of the prompt into text and image chunks (each image resized and
        cut into the tiles its encoder takes); free it with `close()`."""
        mtmd = self._mtmd
        bitmaps = [self._bitmap(image) for image in prompt.images]
        chunks = mtmd.mtmd_input_chunks_init()
        try:
            encoded = prompt.text.encode("utf-8")
            text = mtmd.mtmd_input_text()
            text.text, text.text_len = encoded, len(encoded)
            text.add_special, text.parse_special = prompt.add_bos, True
            array = (mtmd.mtmd_bitmap_p_ctypes * len(bitmaps))(*bitmaps)
            if mtmd.mtmd_tokenize(self._context, chunks, ctypes.byref(text), array, len(bitmaps)) != 0:
                mtmd.mtmd_input_chunks_free(chunks)
                # The rendered prompt has a different number of image places than images (the
                # chat template dropped a message that carried one).
                raise InvalidRequest("the chat template does not place every image of these messages",
                                     param="messages")  # fmt: skip
        finally:
            for bitmap in bitmaps:
                mtmd.mtmd_bitmap_free(bitmap)
        return MediaChunks(mtmd, chunks)

    def evaluate(self, chunks: MediaChunks, llama_context: Any, seq_id: int, n_batch: int) -> int:
        """Evaluate text and images into sequence `seq_id` from position 0, the last token's
        logits kept; returns the position generation goes on from."""
        reached = ctypes.c_int32(0)
        status = self._mtmd.mtmd_helper_eval_chunks(
            self._context, llama_context, chunks.chunks, 0, seq_id, n_batch, True, ctypes.byref(reached)
        )
        if status != 0:
            raise GenerationFailed(f"llama.cpp could not evaluate the prompt with its images (error {status})")
        return int(reached.value)

    def _bitmap(self, image: Any) -> Any:
        """A decoded RGB image as libmtmd's bitmap (no second decode of the file)."""
        width, height = image.size
        pixels = image.tobytes()
        bitmap = self._mtmd.mtmd_bitmap_init(width, height, (ctypes.c_uint8 * len(pixels)).from_buffer_copy(pixels))
        if not bitmap:
            raise GenerationFailed("llama.cpp could not take the image")
        return bitmap


@dataclass(frozen=True)
class ImagePrompt:
    """A rendered chat prompt with one media marker per image, and the decoded images."""

    text: str
    images: Sequence[Any]
    add_bos: bool


class MediaChunks:
    def __init__(self, mtmd: Any, chunks: Any) -> None:
        self._mtmd = mtmd
        self.chunks = chunks
        self.n_tokens = int(mtmd.mtmd_helper_get_n_tokens(chunks))
        """KV cells the prompt takes (an image's tokens included)."""

    def close(self) -> None:
        if self.chunks:
            self._mtmd.mtmd_input_chunks_free(self.chunks)
            self.chunks = None


def with_markers(messages: list[dict[str, Any]], marker: str) -> list[dict[str, Any]]:
    """Messages whose content is a list of parts, as text with the media marker where each
    image goes: GGUF chat templates mostly render `content` as a string."""
    rendered = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            # A marker typed by the user would stand for an image that is not there: dropped.
            text = "".join(part["text"].replace(marker, "") if part.get("type") == "text" else marker
                           for part in content)  # fmt: skip
            message = {**message, "content": text}
        rendered.append(message)
    return rendered
