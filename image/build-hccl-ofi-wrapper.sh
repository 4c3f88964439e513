#!/usr/bin/env bash
# build-hccl-ofi-wrapper.sh: gaudi flavor only. Build libfabric with SynapseAI (Gaudi-direct) and verbs
# support into $LIBFABRIC_ROOT, then Habana's hccl_ofi_wrapper against it, installed as
# /usr/lib/habanalabs/libhccl_ofi_wrapper.so (HCCL dlopens it for host-NIC scale-out: EFA, verbs).
# Versions come from image/versions.env.
set -Eeuo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=image/versions.env
source "$here/versions.env"

readonly WRAPPER_DEST=/usr/lib/habanalabs/libhccl_ofi_wrapper.so

note() { printf 'build-hccl-ofi-wrapper: %s\n' "$*" >&2; }

build_libfabric() {
	local src="$1/libfabric-${LIBFABRIC_VERSION}"
	curl -fsSL "https://github.com/ofiwg/libfabric/releases/download/v${LIBFABRIC_VERSION}/libfabric-${LIBFABRIC_VERSION}.tar.bz2" \
		| tar -xj -C "$1"
	(
		cd "$src"
		./configure --prefix="$LIBFABRIC_ROOT" --enable-verbs=yes --with-synapseai=/usr
		make -j "$(nproc)"
		make install
	)
	printf '%s\n' "$LIBFABRIC_ROOT/lib" >/etc/ld.so.conf.d/gaudi-cluster-libfabric.conf
	ldconfig
	"$LIBFABRIC_ROOT/bin/fi_info" --version
}

build_wrapper() {
	local src="$1/hccl_ofi_wrapper"
	mkdir -p "$src"
	curl -fsSL "https://github.com/HabanaAI/hccl_ofi_wrapper/archive/${HCCL_OFI_WRAPPER_REF}.tar.gz" \
		| tar -xz -C "$src" --strip-components=1
	make -C "$src" LIBFABRIC_ROOT="$LIBFABRIC_ROOT"
	install -D -m 0644 "$src/libhccl_ofi_wrapper.so" "$WRAPPER_DEST"
	ldconfig
}

main() {
	local work
	work="$(mktemp -d)"
	note "libfabric ${LIBFABRIC_VERSION} -> $LIBFABRIC_ROOT"
	build_libfabric "$work"
	note "hccl_ofi_wrapper ${HCCL_OFI_WRAPPER_REF} -> $WRAPPER_DEST"
	build_wrapper "$work"
	rm -rf "$work"
}

main "$@"
