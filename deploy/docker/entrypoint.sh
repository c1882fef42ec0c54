#!/bin/sh
# The image's entry point (under tini, which reaps engine subprocesses and passes SIGTERM on).
# A config mounted at /config/modelpool.yaml is read unless MODELPOOL_CONFIG names another
# file; without one the image serves its starter models, so a run with no volume works.
set -eu
if [ -z "${MODELPOOL_CONFIG:-}" ] && [ -f /config/modelpool.yaml ]; then
    export MODELPOOL_CONFIG=/config/modelpool.yaml
fi
exec modelpool "$@"
