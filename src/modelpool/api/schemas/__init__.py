"""Wire schemas: what clients send, validated strictly (unknown fields are rejected)."""
