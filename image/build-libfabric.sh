#!/usr/bin/env bash
# build-libfabric.sh: gaudi flavor only, for a profile whose libfabric comes from this build
# (profiles.json libfabric.from = "build"; the 1.23/1.24 bases run the AWS EFA installer with --minimal).
# Downloads the profile's release tarball, refuses it unless its sha256 is the profile's, and installs it
# into $LIBFABRIC_ROOT with the profile's configure flags: the recipe and prefix of Habana's own 1.19/1.20
# base images (verbs with Synapse support, for Gaudi Direct over host NICs). Then fails unless
# $LIBFABRIC_ROOT/bin/fi_info reports that version.
# Inputs (build arguments, from the profile): LIBFABRIC_ROOT LIBFABRIC_VERSION LIBFABRIC_URL LIBFABRIC_SHA256
# LIBFABRIC_CONFIGURE.
set -Eeuo pipefail

note() { printf 'build-libfabric: %s\n' "$*" >&2; }
die() {
	printf 'build-libfabric: error: %s\n' "$*" >&2
	exit 1
}

# verify_tarball FILE: the download is the release the profile names, byte for byte.
verify_tarball() {
	local have
	have="$(sha256sum "$1" | cut -d' ' -f1)"
	[[ "$have" == "$LIBFABRIC_SHA256" ]] \
		|| die "$LIBFABRIC_URL has sha256 $have, the profile records $LIBFABRIC_SHA256; fix: check the download, then profiles.json"
}

# ensure_verbs_headers: the verbs provider needs rdma-core's headers; the base's own rdma-core usually has
# them (EFA installer), else Ubuntu's (which apt refuses loudly if it conflicts with the base's rdma-core).
ensure_verbs_headers() {
	[[ -e /usr/include/infiniband/verbs.h ]] && return 0
	note "no /usr/include/infiniband/verbs.h in the base: installing libibverbs-dev and librdmacm-dev"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -q
	apt-get install -y -q --no-install-recommends libibverbs-dev librdmacm-dev
	apt-get clean
	rm -rf /var/lib/apt/lists/*
}

main() {
	local name work configure=()
	for name in LIBFABRIC_ROOT LIBFABRIC_VERSION LIBFABRIC_URL LIBFABRIC_SHA256; do
		[[ -n "${!name:-}" ]] || die "$name is not set; fix: build with 'make image PROFILE=...'"
	done
	[[ "$LIBFABRIC_ROOT" == /* ]] || die "LIBFABRIC_ROOT=$LIBFABRIC_ROOT is not an absolute path"
	read -r -a configure <<<"${LIBFABRIC_CONFIGURE:-}"
	work="$(mktemp -d)"
	note "libfabric $LIBFABRIC_VERSION from $LIBFABRIC_URL into $LIBFABRIC_ROOT (${configure[*]})"
	curl -fsSL --retry 3 -o "$work/libfabric.tar.bz2" "$LIBFABRIC_URL"
	verify_tarball "$work/libfabric.tar.bz2"
	ensure_verbs_headers
	tar -xjf "$work/libfabric.tar.bz2" -C "$work"
	(
		cd "$work/libfabric-$LIBFABRIC_VERSION"
		./configure --prefix="$LIBFABRIC_ROOT" "${configure[@]}"
		make -j"$(nproc)"
		make install
	)
	rm -rf "$work"
	"$LIBFABRIC_ROOT/bin/fi_info" --version | grep -q "libfabric: $LIBFABRIC_VERSION" \
		|| die "$LIBFABRIC_ROOT/bin/fi_info does not report libfabric $LIBFABRIC_VERSION"
	note "installed: $("$LIBFABRIC_ROOT/bin/fi_info" --version | tr '\n' ' ')"
}

main "$@"
