#!/usr/bin/env bash
# Build the local Debian 12 base image used by Molecule nodes and the image-build tests.
# No container registry is reachable here, so the image comes from debootstrap (Debian's own
# mirror) + `podman import`. Idempotent: an existing image is kept unless --force is given.
#   usage: tests/images/build-base.sh [--force]      -> localhost/accelops-debian:bookworm
set -euo pipefail
IMAGE=${ACCELOPS_BASE_IMAGE:-localhost/accelops-debian:bookworm}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
if [ "${1:-}" != "--force" ] && podman image exists "$IMAGE"; then
  exit 0
fi
work=$(mktemp -d /var/tmp/accelops-base.XXXXXX)
trap 'rm -rf "$work"' EXIT
echo "building $IMAGE with debootstrap (about a minute)"
debootstrap --variant=minbase --include=python3,ca-certificates,kmod,procps \
  bookworm "$work/rootfs" "$MIRROR" >"$work/debootstrap.log" 2>&1 || { tail -20 "$work/debootstrap.log"; exit 1; }
rm -rf "$work/rootfs/var/cache/apt/archives/"*.deb "$work/rootfs/var/lib/apt/lists/"*
tar -C "$work/rootfs" -c . | podman import --change 'CMD ["/bin/bash"]' - "$IMAGE" >/dev/null
echo "built $IMAGE"
