"""Tool calls in generated text: per-family streaming parsers, call assembly, chunk streams."""
