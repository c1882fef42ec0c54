"""Hugging Face models: references (`hf:org/repo:Q4_K_M@rev`), which files a backend needs,
downloads with progress, the repo seen as files for detection, and the cache.

Imports only `modelpool.errors` (and huggingface_hub, lazily): `config` and the CLI build on it."""
