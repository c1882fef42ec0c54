"""PyTorch/transformers causal LMs with continuous batching."""
