"""Rate limits and usage per caller (API key or client address)."""
