"""Live transcription: a transcript that grows as audio streams in (the realtime API)."""
