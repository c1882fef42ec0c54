"""The image's HEALTHCHECK: exit 0 when the server in this container answers /readyz with 200.

The standard library only (the image has no curl, and importing modelpool's CLI would cost
seconds per check). The port is MODELPOOL_SERVER__PORT, as the image sets it; a port set in
the config file alone is not seen here (set the variable instead, docs/containers.md).
"""

import os
import sys
import urllib.error
import urllib.request

port = os.environ.get("MODELPOOL_SERVER__PORT", "8000")
try:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=4) as reply:
        sys.exit(0 if reply.status == 200 else 1)
except (urllib.error.URLError, OSError, ValueError) as exc:
    print(f"not ready: {exc}", file=sys.stderr)
    sys.exit(1)
