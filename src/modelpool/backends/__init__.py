"""Engines behind the backend contract (see base.py); picked by name through registry.py."""
