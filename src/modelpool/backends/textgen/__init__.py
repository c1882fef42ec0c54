"""The text-generation kit the in-process LLM engines share (llama.cpp, transformers,
CTranslate2, and the engines added after them).

An engine keeps only what is its own: loading, templates, vision, and how it prefills and
decodes a batch. The rest lives here, once:

- `sequence`: one request's generation state (stops, logprobs, min/max tokens, its end,
  cancellation) fed one token at a time by whatever engine computed it;
- `logprobs`: the log-probability entries of a token and its top alternatives;
- `engine_loop`: the engine thread (intake, step, step failure, shutdown);
- `pipeline`: what a chat's text goes through after the sequence, in one order;
- `decoding`, `detokenize`, `channel`, `step_failure`, `reasoning`, `hf_text`,
  `hf_convert`: the helpers those are made of.
"""
