#!/bin/sh
# pip inside the image build. The build arguments PIP_CERT and PIP_FIND_LINKS are optional:
# an empty one must not reach pip (PIP_CERT="" would be read as a certificate file named "").
# PIP_FIND_LINKS may name several folders, separated by spaces (pip splits the variable).
set -eu
[ -n "${PIP_CERT:-}" ] || unset PIP_CERT
[ -n "${PIP_FIND_LINKS:-}" ] || unset PIP_FIND_LINKS
exec /opt/modelpool/bin/python -m pip --no-cache-dir --disable-pip-version-check "$@"
