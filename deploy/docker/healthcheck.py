"""The image's HEALTHCHECK: exit 0 when the server in this container answers /readyz with 200.

The standard library only (the image has no curl, and importing modelpool's CLI would cost
seconds per check). The port is MODELPOOL_SERVER__PORT, as the image sets it; a port set in
the config file alone is not seen here (set the variable instead, docs/containers.md). It
must be a port number: anything else (a host smuggled in as `1@elsewhere`) is unhealthy.
"""

import os
import sys
import urllib.error
import urllib.request


def main() -> int:
    port = os.environ.get("MODELPOOL_SERVER__PORT", "8000").strip()
    if not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
        print(f"not ready: MODELPOOL_SERVER__PORT is not a port number: {port[:20]!r}", file=sys.stderr)
        return 1
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=4) as reply:
            return 0 if reply.status == 200 else 1
    except (urllib.error.URLError, OSError) as exc:  # HTTPError (a 503) is a URLError
        print(f"not ready: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
