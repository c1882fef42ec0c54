"""One request in the transformers batch: the kit's sequence, with its token ids, its own
random generator (a seeded request gives the same tokens alone or in a busy batch), its
prefill state and image inputs, and how its logprobs come from a row of torch logits."""

from __future__ import annotations

from typing import Any

import torch

from modelpool.backends.constraint import TokenConstraint
from modelpool.backends.textgen.logprobs import decoded, entry
from modelpool.backends.textgen.sequence import Detokenizer, Output, TextSequence
from modelpool.backends.transformers.adapters import AdapterSpec
from modelpool.inference import SamplingParams, TokenLogprob


class Sequence(TextSequence):
    """The kit's sequence, with what the batch keeps of it: its token ids (penalties, the
    next step's input), its random generator, its prefill state and its image inputs."""

    def __init__(
        self,
        *,
        prompt: list[int],
        params: SamplingParams,
        max_new: int,
        out: Output,
        generator: torch.Generator,
        detok: Detokenizer,
        tokenizer: Any,
        eos_ids: set[int],
        constraint: TokenConstraint | None = None,
        vision: dict[str, Any] | None = None,
        adapter: AdapterSpec | None = None,
    ) -> None:
        super().__init__(sampling=params, max_new=max_new, output=out, detok=detok, end_ids=eos_ids,
                         prompt_tokens=len(prompt), constraint=constraint)  # fmt: skip
        self.prompt = prompt
        self.eos_ids = eos_ids
        self.generator = generator
        self.tokenizer = tokenizer
        self.vision = vision
        """A vision model's image inputs (pixel_values, ...) for the prompt: it is prefilled
        in one piece with them, then decodes in the batch like any other sequence."""
        self.adapter = adapter
        """The LoRA adapter this sequence runs with (None: the base model)."""
        self.position_offset = 0
        """Added to the positions of this sequence's generated tokens. Qwen2-VL gives an
        image fewer rotary positions than tokens (M-RoPE); the model reports the difference
        when it prefills the prompt, and decoding must go on from there."""
        self.tokens: list[int] = []
        """The generated token ids."""
        self.prefilled = 0
        """Tokens of `context` in its prefill cache so far (a long context is prefilled in pieces)."""
        self.cache: Any = None
        self._resume: list[int] | None = None
        self.preemptions = 0
        """Times it stepped out of the batch to keep the batch's KV cache within its budget."""
        self.logits: torch.Tensor | None = None
        """The row of logits the token being accepted was chosen from (for its logprob)."""

    @property
    def length(self) -> int:
        return len(self.prompt) + len(self.tokens)

    @property
    def context(self) -> list[int]:
        """The ids its prefill runs: the prompt, or after a preemption the prompt and every
        token generated so far (the last one included: its prefill's logits choose the next
        token, as the decode step it missed would have)."""
        return self._resume if self._resume is not None else self.prompt

    def preempt(self) -> None:
        """Its KV was dropped from the batch: it goes back to prefill and resumes from what it
        has, choosing no token again (its sampler, grammar and stops go on where they were)."""
        self._resume = [*self.prompt, *self.tokens]
        self.prefilled = 0
        self.cache = None
        self.preemptions += 1

    def accept(self, token: int) -> bool:
        if token not in self.end_ids:
            self.tokens.append(token)
        return super().accept(token)

    def logprob(self, token: int) -> TokenLogprob:
        assert self.logits is not None
        logprobs = torch.log_softmax(self.logits.float(), dim=-1)
        spell = decoded(self.tokenizer)
        return entry(token, float(logprobs[token]), spell(token), best_of(logprobs, self.sampling.logprobs or 0), spell)


def best_of(logprobs: torch.Tensor, top_n: int) -> list[tuple[int, float]]:
    """The `top_n` most likely (token id, log-probability) of a row, best first (torch's top-k)."""
    if not top_n:
        return []
    values, indices = torch.topk(logprobs, top_n)
    return [(int(i), float(v)) for v, i in zip(values, indices, strict=True)]
