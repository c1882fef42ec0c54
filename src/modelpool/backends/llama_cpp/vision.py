"""Images for an in-process llama.cpp model: a GGUF vision projector (`mmproj`) through
libmtmd, as llama-cpp-python binds it.

The prompt is rendered with the model's own chat template, an image part becoming
libmtmd's media marker; libmtmd splits it into text and image chunks, and each chunk is
evaluated into the context (an image as its projected embeddings). Generation then goes on
from there, with every option a text prompt has (sampling, stops, logprobs, grammars).
Everything here runs on the backend's engine thread.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from modelpool.errors import ContextLengthExceeded, GenerationFailed, InvalidRequest, ModelLoadFailed

if TYPE_CHECKING:
    from llama_cpp import Llama


class ImageProjector:
    def __init__(self, llm: Llama, path: str, *, n_threads: int, use_gpu: bool, model_id: str) -> None:
        import llama_cpp.mtmd_cpp as mtmd

        self._mtmd = mtmd
        params = mtmd.mtmd_context_params_default()
        params.use_gpu = use_gpu
        params.print_timings = False
        params.n_threads = n_threads
        context = mtmd.mtmd_init_from_file(path.encode(), llm.model, params)
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

    def prefill(self, llm: Llama, text: str, images: Sequence[Any], *, add_bos: bool) -> list[int]:
        """Evaluate `text` (with one marker per image) and the images into a fresh context;
        returns the prompt as llama-cpp-python then holds it (image positions included), for
        generation to continue from."""
        mtmd = self._mtmd
        bitmaps = [self._bitmap(image) for image in images]
        chunks = mtmd.mtmd_input_chunks_init()
        try:
            encoded = text.encode("utf-8")
            prompt = mtmd.mtmd_input_text()
            prompt.text, prompt.text_len = encoded, len(encoded)
            prompt.add_special, prompt.parse_special = add_bos, True
            array = (mtmd.mtmd_bitmap_p_ctypes * len(bitmaps))(*bitmaps)
            if mtmd.mtmd_tokenize(self._context, chunks, ctypes.byref(prompt), array, len(bitmaps)) != 0:
                # The rendered prompt has a different number of image places than images (the
                # chat template dropped a message that carried one).
                raise InvalidRequest("the chat template does not place every image of these messages",
                                     param="messages")  # fmt: skip
            llm.reset()
            llm._ctx.kv_cache_clear()
            for index in range(mtmd.mtmd_input_chunks_size(chunks)):
                self._evaluate(llm, mtmd.mtmd_input_chunks_get(chunks, index))
            return [int(t) for t in llm.input_ids[: llm.n_tokens]]
        finally:
            mtmd.mtmd_input_chunks_free(chunks)
            for bitmap in bitmaps:
                mtmd.mtmd_bitmap_free(bitmap)

    def _evaluate(self, llm: Llama, chunk: Any) -> None:
        mtmd = self._mtmd
        size = mtmd.mtmd_input_chunk_get_n_tokens(chunk)
        if llm.n_tokens + size > llm.n_ctx():
            raise ContextLengthExceeded(
                f"the prompt with its images needs more than the context's {llm.n_ctx()} tokens", param="messages"
            )
        if mtmd.mtmd_input_chunk_get_type(chunk) == mtmd.MTMD_INPUT_CHUNK_TYPE_TEXT:
            count = ctypes.c_size_t()
            pointer = mtmd.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(count))
            llm.eval([pointer[i] for i in range(count.value)])
            return
        reached = ctypes.c_int32(0)
        status = mtmd.mtmd_helper_eval_chunk_single(
            self._context, llm._ctx.ctx, chunk, llm.n_tokens, 0, llm.n_batch, False, ctypes.byref(reached)
        )
        if status != 0:
            raise GenerationFailed(f"llama.cpp could not evaluate an image (error {status})")
        # The image's positions hold no token: mark them so that no later prompt (with
        # reuse_prompt_cache) can match a stale token there and inherit this image's KV cells.
        llm.input_ids[llm.n_tokens : reached.value] = -1
        llm.n_tokens = reached.value

    def _bitmap(self, image: Any) -> Any:
        """A decoded RGB image as libmtmd's bitmap (no second decode of the file)."""
        width, height = image.size
        pixels = image.tobytes()
        bitmap = self._mtmd.mtmd_bitmap_init(width, height, (ctypes.c_uint8 * len(pixels)).from_buffer_copy(pixels))
        if not bitmap:
            raise GenerationFailed("llama.cpp could not take the image")
        return bitmap


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
