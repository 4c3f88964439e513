#!/usr/bin/env bash
# Provide the Debian 12 base image of the cpu flavor, without needing a registry:
# use it if present; else pull debian:bookworm-slim where a registry answers; else debootstrap it
# locally (installing debootstrap first when we are root and it is missing).
set -Eeuo pipefail

image="${1:-${BASE_IMAGE_CPU:-gaudi-cluster/debian:bookworm}}"
suite="${DEBIAN_SUITE:-bookworm}"
registry_image="${DEBIAN_IMAGE:-debian:bookworm-slim}"

note() { printf 'make-base-image: %s\n' "$*" >&2; }
die() {
	printf 'make-base-image: error: %s\n' "$*" >&2
	exit 1
}

if docker image inspect "$image" >/dev/null 2>&1; then
	note "$image already present"
	exit 0
fi

note "trying to pull $registry_image (up to 60 s)"
if timeout 60 docker pull -q "$registry_image" >/dev/null 2>&1; then
	docker tag "$registry_image" "$image"
	note "pulled $registry_image as $image"
	exit 0
fi
note "no registry answers; making $image with debootstrap instead (about 30 s, 200 MB)"

if ! command -v debootstrap >/dev/null; then
	if [[ $EUID -eq 0 ]] && command -v apt-get >/dev/null; then
		note "installing debootstrap (apt-get, about 20 s)"
		if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null; }; then
			die "could not install debootstrap; fix: apt-get install -y debootstrap, then make demo again"
		fi
	else
		die "debootstrap is not installed and no registry answers; fix: sudo apt-get install -y debootstrap && make demo (or: docker pull $registry_image)"
	fi
fi
[[ $EUID -eq 0 ]] || die "debootstrap needs root; fix: sudo make base-image, then make demo"

rootfs="$(mktemp -d /tmp/gaudi-cluster-rootfs.XXXXXX)"
trap 'rm -rf "$rootfs"' EXIT

note "debootstrap $suite into $rootfs"
debootstrap --variant=minbase "$suite" "$rootfs" >/tmp/gaudi-cluster-debootstrap.log 2>&1 \
	|| die "debootstrap failed; see /tmp/gaudi-cluster-debootstrap.log"
# Keep the image small and reproducible: no apt lists or caches from the bootstrap.
rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin
tar -C "$rootfs" -c . | docker import --change 'CMD ["bash"]' - "$image" >/dev/null
note "imported $image"
