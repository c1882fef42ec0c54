"""Per-task helpers the pool's request methods run on a leased model: embeddings and their
cache, pair scores, log-likelihoods, tokenization, images in chat requests, the decoded-audio budget."""
