#!/usr/bin/env bash
# build-hccl-ofi-wrapper.sh: gaudi flavor only. Build Habana's hccl_ofi_wrapper at the profile's commit
# (HCCL_OFI_WRAPPER_COMMIT) against the image's one libfabric ($LIBFABRIC_ROOT, from the base's EFA
# installer), install it as /usr/lib/habanalabs/libhccl_ofi_wrapper.so (HCCL dlopens it by that name for
# host-NIC scale-out: EFA, verbs) and fail the build unless
#   - its plugin interface is the one the profile's HCCL expects (check-hccl-ofi-wrapper.sh), and
#   - the loader resolves it, and its libfabric, to what was just built against ($LD_LIBRARY_PATH).
# Inputs are build arguments (make image passes them from app/gaudi_cluster/settings/profiles.json).
set -Eeuo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
readonly WRAPPER_NAME=libhccl_ofi_wrapper.so
readonly WRAPPER_DEST=/usr/lib/habanalabs/$WRAPPER_NAME
readonly REPO=https://github.com/HabanaAI/hccl_ofi_wrapper
# The source tarball of the commit: GitHub's archive unless the build passes another (file:// works).
url="${HCCL_OFI_WRAPPER_URL:-$REPO/archive/${HCCL_OFI_WRAPPER_COMMIT:-}.tar.gz}"

note() { printf 'build-hccl-ofi-wrapper: %s\n' "$*" >&2; }
die() {
	printf 'build-hccl-ofi-wrapper: error: %s\n' "$*" >&2
	exit 1
}

# first_on_loader_path NAME: the file a dlopen("NAME") finds first: LD_LIBRARY_PATH, then the ld cache.
first_on_loader_path() {
	local dir
	local -a dirs
	IFS=: read -r -a dirs <<<"${LD_LIBRARY_PATH:-}"
	for dir in "${dirs[@]}"; do
		[[ -n "$dir" && -e "$dir/$1" ]] && {
			printf '%s\n' "$dir/$1"
			return
		}
	done
	ldconfig -p | awk -v name="$1" '$1 == name {print $NF; exit}'
}

build_wrapper() {
	local src="$1/hccl_ofi_wrapper"
	mkdir -p "$src"
	curl -fsSL "$url" | tar -xz -C "$src" --strip-components=1
	# The Makefile's default goal is the target named `make`; it reads LIBFABRIC_ROOT.
	make -C "$src" LIBFABRIC_ROOT="$LIBFABRIC_ROOT"
	bash "$here/check-hccl-ofi-wrapper.sh" "$src/$WRAPPER_NAME" "$HCCL_OFI_WRAPPER_INTERFACE"
	install -D -m 0644 "$src/$WRAPPER_NAME" "$WRAPPER_DEST"
	ldconfig
}

check_resolution() {
	local found fabric
	found="$(first_on_loader_path "$WRAPPER_NAME")"
	[[ "$(readlink -f "$found")" == "$(readlink -f "$WRAPPER_DEST")" ]] \
		|| die "dlopen($WRAPPER_NAME) would load '$found', not $WRAPPER_DEST; fix: remove that copy or reorder LD_LIBRARY_PATH"
	bash "$here/check-hccl-ofi-wrapper.sh" "$found" "$HCCL_OFI_WRAPPER_INTERFACE"
	fabric="$(ldd "$found" | awk '$1 ~ /^libfabric\.so/ {print $3; exit}')"
	[[ "$(readlink -f "$fabric")" == "$(readlink -f "$LIBFABRIC_ROOT/lib/libfabric.so.1")" ]] \
		|| die "$found resolves libfabric to '$fabric', not the $LIBFABRIC_ROOT it was built against"
	note "$found -> $fabric"
}

main() {
	local name work
	for name in HCCL_OFI_WRAPPER_COMMIT HCCL_OFI_WRAPPER_INTERFACE LIBFABRIC_ROOT; do
		[[ -n "${!name:-}" ]] || die "$name is not set; fix: build with 'make image PROFILE=gaudi|dl1'"
	done
	[[ "$HCCL_OFI_WRAPPER_COMMIT" =~ ^[0-9a-f]{40}$ ]] \
		|| die "HCCL_OFI_WRAPPER_COMMIT='$HCCL_OFI_WRAPPER_COMMIT' is not a commit SHA; fix: pin a full SHA in profiles.json"
	work="$(mktemp -d)"
	note "hccl_ofi_wrapper ${HCCL_OFI_WRAPPER_COMMIT} ($url) against $LIBFABRIC_ROOT -> $WRAPPER_DEST"
	build_wrapper "$work"
	check_resolution
	rm -rf "$work"
}

main "$@"
