#!/usr/bin/env bash
# Makes this machine able to build and run the images tests/containers builds: Podman (it
# reads the same Dockerfiles as Docker and needs no daemon) and a local Debian base image.
# A host with no registry at hand cannot pull `debian:bookworm-slim`, so the base is made
# with debootstrap from the Debian mirror apt already uses (~30 s, ~200 MB, once) and the
# tests build with `--build-arg BASE=localhost/debian:bookworm-min`.
#
# Idempotent. Needs root for apt; without it (or without apt) it says so and fails, and the
# container tests skip with the reason.
set -euo pipefail
cd "$(dirname "$0")/.."
BASE_IMAGE=${MODELPOOL_TEST_BASE_IMAGE:-localhost/debian:bookworm-min}
# The settings this kind of sandbox needs (see the file); harmless on an ordinary host.
export CONTAINERS_CONF=${CONTAINERS_CONF:-$PWD/tests/containers/containers.conf}

missing=()
for tool in podman runc debootstrap; do command -v "$tool" >/dev/null 2>&1 || missing+=("$tool"); done
if [ ${#missing[@]} -gt 0 ]; then
    if ! command -v apt-get >/dev/null 2>&1 || [ "$(id -u)" != 0 ]; then
        echo "container_host: ${missing[*]} missing and no root apt-get to install them" >&2
        exit 1
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman runc debootstrap >/dev/null
fi

if ! podman image exists "$BASE_IMAGE"; then
    # The mirror apt uses here (deb822 sources first, then the one-line format).
    mirror=$(sed -n 's/^URIs: *\([^ ]*debian\/\{0,1\}\)$/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n1)
    [ -n "$mirror" ] || mirror=$(awk '$1 == "deb" && $2 ~ /debian\/?$/ {print $2; exit}' /etc/apt/sources.list 2>/dev/null)
    mirror=${mirror:-http://deb.debian.org/debian}
    rootfs=$(mktemp -d)
    trap 'rm -rf "$rootfs"' EXIT
    echo "container_host: making $BASE_IMAGE with debootstrap from $mirror"
    debootstrap --variant=minbase bookworm "$rootfs" "$mirror" >/dev/null
    tar -C "$rootfs" -c . | podman import - "$BASE_IMAGE" >/dev/null
fi
echo "container_host: podman $(podman --version | awk '{print $3}'), base image $BASE_IMAGE"
