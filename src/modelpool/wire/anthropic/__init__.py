"""Anthropic's Messages API: request schemas, their translation to pool requests, and the
pool's results as Anthropic's messages, stream events and error bodies."""
