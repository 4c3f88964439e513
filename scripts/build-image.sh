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

(($# >= 1)) || die "usage: build-image.sh IMAGE_TAG [docker build args...]"
tag="$1"
shift
docker info >/dev/null 2>&1 || die "no Docker engine answers; fix: scripts/start-docker-engine.sh (as root) or start Docker"

if docker image inspect "$tag" >/dev/null 2>&1; then
	note "building $tag (cached layers: usually seconds; Docker prints Step N/M as it goes)"
else
	note "building $tag for the first time: about 10 minutes on 2 cores (Docker prints Step N/M as it goes)"
fi
started=$SECONDS
docker build -t "$tag" "$@" .

stage="$(docker images -q --filter dangling=true --filter label=io.gaudi-cluster.stage=build | head -n 1)"
if [[ -n "$stage" ]]; then
	docker tag "$stage" "$tag-build-stage"
fi
# Only dangling images carry these labels now: earlier builds of this image and of its stage.
docker image prune -f --filter label=io.gaudi-cluster.stage=build >/dev/null
docker image prune -f --filter label=org.opencontainers.image.title=gaudi-cluster >/dev/null
note "built $tag in $((SECONDS - started)) s"
