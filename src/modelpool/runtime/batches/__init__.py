"""OpenAI's Files and Batches APIs: uploaded JSONL files of requests, run in the background
through the pool as the key that made them, their state in SQLite so a restart resumes."""
