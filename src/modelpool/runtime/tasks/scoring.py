"""Log-likelihoods of continuations, composed from a backend's tokenizer and token scores.

Tokenization at the prompt/continuation boundary follows lm-evaluation-harness: the
continuation's tokens are those of `prompt + continuation` beyond the tokens of `prompt`
alone. (When the two texts merge into one token at the boundary, that token counts as
continuation.) An empty prompt means the model's beginning-of-text token as context.
"""

from __future__ import annotations

from modelpool.backends.base import ScoringBackend
from modelpool.errors import InvalidRequest
from modelpool.pool_api.results import Loglikelihood


async def loglikelihood(backend: ScoringBackend, prompt: str, continuation: str, index: int) -> Loglikelihood:
    context = await backend.tokenize(prompt) if prompt else []
    whole = await backend.tokenize(prompt + continuation)
    if not context:
        start = await backend.start_token()
        if start is None:
            raise InvalidRequest("an empty prompt needs a model with a start-of-text token", param=f"prompts[{index}]")
        context, whole = [start], [start, *whole]
    if len(whole) <= len(context):
        raise InvalidRequest("the continuation adds no tokens to its prompt", param=f"continuations[{index}]")
    scored = await backend.score_tokens(whole, top_n=0)
    tail = scored[len(context) :]
    return Loglikelihood(sum(t.logprob or 0.0 for t in tail), all(t.greedy for t in tail), len(whole))
