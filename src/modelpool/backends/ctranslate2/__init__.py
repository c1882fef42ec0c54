"""CTranslate2 causal LMs (int8 on the CPU), batched, each request streamed on its own."""
