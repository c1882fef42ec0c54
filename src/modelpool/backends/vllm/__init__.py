"""`backend: vllm`: vLLM's async engine in modelpool's process (see backend.py)."""
