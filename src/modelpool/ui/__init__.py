"""The workbench: a web UI over the pool, served at `/ui` from files inside this package
(plain ES modules, no build step, no CDN: it works offline)."""

from pathlib import Path

STATIC_DIR = Path(__file__).parent / "static"
