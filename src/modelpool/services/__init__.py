"""Supervising OS processes: spawn, health-poll, log capture, stop with escalation, ports."""
