"""The `modelpool` command."""
