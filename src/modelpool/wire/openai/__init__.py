"""OpenAI's protocol: request schemas, their translation to pool requests, and the pool's
results as OpenAI's response bodies and stream events; also the upstream side (`upstream`)."""
