"""Exit 0 when a package index can be reached (or none is named), 1 when it cannot.

`make install` asks this once before handing PyTorch's index to pip: pip retries an
unreachable index for every package it looks up, with back-off (76 s for torch's dozen
dependencies where DNS fails at once), while this answers in milliseconds there and in at
most TIMEOUT_S elsewhere. Any HTTP answer, even an error status, and a TLS failure count as
reachable: pip, with its own certificates and proxy settings, is the judge of those.
"""

from __future__ import annotations

import ssl
import sys
import urllib.error
import urllib.request

TIMEOUT_S = 10.0


def reachable(url: str) -> bool:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=TIMEOUT_S):
            return True
    except urllib.error.HTTPError:
        return True  # the server answered
    except urllib.error.URLError as exc:
        return isinstance(exc.reason, ssl.SSLError)
    except (OSError, ValueError):  # a timeout, a reset, a malformed URL
        return False


if __name__ == "__main__":
    url = sys.argv[1] if len(sys.argv) > 1 else ""
    sys.exit(0 if not url or reachable(url) else 1)
