#!/usr/bin/env bash
# Provide the Debian 12 base image for the cpu flavor without a registry:
# use it if present, pull it where a registry answers, else debootstrap it locally.
set -Eeuo pipefail

image="${1:-${BASE_IMAGE_CPU:-gaudi-cluster/debian:bookworm}}"
suite="${DEBIAN_SUITE:-bookworm}"

note() { printf 'make-base-image: %s\n' "$*" >&2; }
die() { printf 'make-base-image: error: %s\n' "$*" >&2; exit 1; }

if docker image inspect "$image" >/dev/null 2>&1; then
	note "$image already present"
	exit 0
fi

if [[ "$image" == debian:* ]] && timeout 60 docker pull "$image" >/dev/null 2>&1; then
	note "pulled $image"
	exit 0
fi

command -v debootstrap >/dev/null || die "debootstrap is not installed; fix: apt-get install -y debootstrap"
[[ $EUID -eq 0 ]] || die "debootstrap needs root; fix: run this script as root"

rootfs="$(mktemp -d /tmp/gaudi-cluster-rootfs.XXXXXX)"
trap 'rm -rf "$rootfs"' EXIT

note "debootstrap $suite into $rootfs (about 30 s)"
debootstrap --variant=minbase "$suite" "$rootfs" >/tmp/gaudi-cluster-debootstrap.log 2>&1 \
	|| die "debootstrap failed; see /tmp/gaudi-cluster-debootstrap.log"
# Keep the image small and reproducible: no apt lists or caches from the bootstrap.
rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin
tar -C "$rootfs" -c . | docker import --change 'CMD ["bash"]' - "$image" >/dev/null
note "imported $image"
