#!/usr/bin/env bash
# make-standin.sh: TEST-ONLY (make image-gaudi-standin). Build the gaudi flavor's real Dockerfile path
# offline against a stand-in of the gaudi profile's vault base:
#   1. build/gaudi-standin/: the base's wheels (wheels.txt: linked from build/wheelhouse, the rest fetched
#      on the host by scripts/make-wheelhouse.sh), a bare git repository standing in for HabanaAI/DeepSpeed
#      (branch 1.23.0, fixed dates: the same commit every time), the hccl_ofi_wrapper stand-in's tarball;
#   2. the stand-in base image STANDIN_BASE (Dockerfile here) on gaudi-cluster/debian:bookworm;
#   3. scripts/build-gaudi-image.sh gaudi, as make image runs it, with the fork at that bare repository
#      (git ls-remote resolves it), the pin file in build/gaudi-standin/pins, and three build arguments
#      set: BASE_IMAGE (the stand-in), PT_VERSION (its CPU torch), LIBFABRIC_SOURCE=base (no tarball download offline: the base's
#      libfabric at the profile's root) and HCCL_OFI_WRAPPER_URL (the stand-in's file:// tarball).
# Every step is cached: a second run rebuilds nothing unless an input changed.
# `make-standin.sh context` makes step 1 only (no Docker).
set -Eeuo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
ctx="$root/build/gaudi-standin"
fork="$ctx/deepspeed-fork.git"
base="${STANDIN_BASE:-gaudi-cluster/gaudi-standin:1.24.1}"
image_name="${STANDIN_IMAGE_NAME:-gaudi-cluster-standin}"
debian="${BASE_IMAGE_CPU:-gaudi-cluster/debian:bookworm}"
# The stand-in's torch: the cpu flavor's CPU build (its wheel is in build/wheelhouse) for Habana's 2.11.0,
# so that the build's own imports (transformers, in the embedded data step) work; PT_VERSION says so.
readonly STANDIN_TORCH=2.13.0

note() { printf 'make-standin: %s\n' "$*" >&2; }

wheels() {
	local pin file prefix
	mkdir -p "$ctx/wheels"
	# The cpu wheelhouse already holds most of them: hard links, not a second download.
	while read -r pin; do
		for file in "$root"/build/wheelhouse/*.whl; do
			[[ -e "$file" ]] || continue
			local name="${file##*/}"
			prefix="$(printf '%s' "${pin%%==*}" | tr '[:upper:]-' '[:lower:]_')-${pin#*==}"
			# torch==2.13.0 is the file torch-2.13.0+cpu-...: a local label counts (PEP 440).
			[[ "${name,,}" == "$prefix"-* || "${name,,}" == "$prefix"+* ]] && ln -f "$file" "$ctx/wheels/" 2>/dev/null
		done
	done < <(grep -v '^#' "$here/wheels.txt")
	"$root/scripts/make-wheelhouse.sh" "$here/wheels.txt" "$ctx/wheels"
}

# fork: the same commit every run (fixed author, committer and dates), so the base's layer stays cached.
fork_repo() {
	local work
	work="$(mktemp -d)"
	cp -r "$here/deepspeed-fork/." "$work/"
	export GIT_AUTHOR_NAME=standin GIT_AUTHOR_EMAIL=standin@invalid GIT_COMMITTER_NAME=standin \
		GIT_COMMITTER_EMAIL=standin@invalid GIT_AUTHOR_DATE=2026-01-01T00:00:00Z GIT_COMMITTER_DATE=2026-01-01T00:00:00Z
	git -C "$work" init -q -b 1.23.0
	git -C "$work" add .
	git -C "$work" -c core.fileMode=false commit -q -m "DeepSpeed content for 1.23.0 (test stand-in)"
	rm -rf "$fork"
	git clone -q --bare "$work" "$fork"
	# No trace of the temporary checkout (it would change the base's layer, and so its cache, every run).
	git -C "$fork" remote remove origin
	rm -rf "$work"
	note "stand-in fork $fork: 1.23.0 = $(git -C "$fork" rev-parse 1.23.0)"
}

wrapper_tarball() {
	tar --sort=name --mtime=2026-01-01 --owner=0 --group=0 --numeric-owner -C "$here" \
		--transform 's|^hccl_ofi_wrapper|hccl_ofi_wrapper-standin|' -c hccl_ofi_wrapper \
		| gzip -n >"$ctx/hccl_ofi_wrapper.tar.gz"
}

context() {
	mkdir -p "$ctx"
	wheels
	fork_repo
	wrapper_tarball
	cp "$here/Dockerfile" "$here/mpirun" "$here/standin-base.sh" "$root/tests/cluster/hpu/hl-smi" "$ctx/"
	touch -d 2026-01-01 "$ctx/mpirun" "$ctx/standin-base.sh" "$ctx/hl-smi" "$ctx/hccl_ofi_wrapper.tar.gz"
	printf '%s\n' '*' '!wheels' '!deepspeed-fork.git' '!hccl_ofi_wrapper.tar.gz' '!mpirun' '!hl-smi' \
		'!standin-base.sh' >"$ctx/.dockerignore"
}

main() {
	local started=$SECONDS
	context
	[[ "${1:-}" == context ]] && return
	note "stand-in base $base (on $debian)"
	docker build -q -t "$base" --build-arg DEBIAN_BASE="$debian" --build-arg FORK_PATH="$fork" \
		--build-arg PT_VERSION="$STANDIN_TORCH" "$ctx" >/dev/null
	note "base ready after $((SECONDS - started)) s; building the gaudi flavor on it"
	PINS_DIR="$ctx/pins" HABANA_DEEPSPEED_REPO="file://$fork" HABANA_DEEPSPEED_COMMIT="" \
		"$root/scripts/build-gaudi-image.sh" gaudi "$image_name" "${VERSION:-0.1.0}" "${GIT_REV:-standin}" \
		--set BASE_IMAGE="$base" --set LIBFABRIC_SOURCE=base --set PT_VERSION="$STANDIN_TORCH" \
		--set HCCL_OFI_WRAPPER_URL=file:///opt/standin/hccl_ofi_wrapper.tar.gz
	note "done in $((SECONDS - started)) s: $image_name:gaudi"
}

main "$@"
