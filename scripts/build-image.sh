#!/usr/bin/env bash
# build-image.sh IMAGE_TAG [docker build arguments...]: build the node image with the classic builder,
# then keep the build tidy: the builder stage (the venv made from the wheelhouse, about 2.5 GB) is
# tagged IMAGE_TAG-build-stage instead of left dangling, because it is the cache that makes the next
# build take seconds; superseded builds of the image and of that stage are removed.
set -Eeuo pipefail

note() { printf 'build-image: %s\n' "$*" >&2; }
die() {
	printf 'build-image: error: %s\n' "$*" >&2
	exit 1
}

# disk_hint: Docker's own "no space left on device" names neither the disk nor what fills it. A build
# needs up to ~4 GB of free space (the venv layer is 1.5 GB, and twice that while it is copied).
disk_hint() {
	local root free_mb
	root="$(docker info --format '{{.DockerRootDir}}' 2>/dev/null)" || return 0
	[[ -d "$root" ]] || return 0 # a remote engine: its disk is not ours to measure
	free_mb="$(df -Pm "$root" | awk 'NR == 2 { print $4 }')"
	if ((free_mb < 4096)); then
		die "Docker's disk ($root) has only $free_mb MB free; fix: remove old images (docker images; docker image prune) or free space, then build again"
	fi
}

(($# >= 1)) || die "usage: build-image.sh IMAGE_TAG [docker build args...]"
tag="$1"
shift
docker info >/dev/null 2>&1 || die "no Docker engine answers; fix: scripts/start-docker-engine.sh (as root) or start Docker"

if docker image inspect "$tag" >/dev/null 2>&1; then
	note "building $tag (cached layers: usually seconds; Docker prints Step N/M as it goes)"
else
	note "building $tag for the first time: about 10 minutes on 2 cores (Docker prints Step N/M as it goes)"
fi
# The extra tags (-t NAME) are the image's, not its venv stage's.
tags=() args=()
while (($# > 0)); do
	if [[ "$1" == -t && $# -ge 2 ]]; then
		tags+=(-t "$2")
		shift 2
	else
		args+=("$1")
		shift
	fi
done

# build TARGET_ARGS...: docker build; --force-rm: a failed step leaves no container behind, which would
# keep its image (and the disk it holds) from every prune.
build() {
	if ! docker build --force-rm "$@" "${args[@]}" .; then
		disk_hint
		die "docker build of $tag failed (its own error is above)"
	fi
}

started=$SECONDS
# The venv stage first, under its own tag: built by name, it is this build's stage for sure. (Picking "the
# dangling image with the stage's label" afterwards picked an older stage whenever this one came from the
# cache, and the prune below then deleted the real one: every other build made the venv again, ~2 min, and
# copied it into a new 1.5 GB layer.)
build --target python -t "$tag-build-stage"
build -t "$tag" "${tags[@]}"

# Only dangling images carry these labels now: earlier builds of this image and of its stage.
docker image prune -f --filter label=io.gaudi-cluster.stage=build >/dev/null
docker image prune -f --filter label=org.opencontainers.image.title=gaudi-cluster >/dev/null
note "built $tag in $((SECONDS - started)) s"
