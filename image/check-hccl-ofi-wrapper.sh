#!/usr/bin/env bash
# check-hccl-ofi-wrapper.sh LIB INTERFACE: fail unless the built libhccl_ofi_wrapper.so LIB has the plugin
# interface HCCL expects.
#
#   INTERFACE=destructor     HCCL >= 1.19: its copy of the interface (HabanaAI/HCL,
#                            hcl/hccl_ofi_wrapper/hccl_ofi_wrapper_interface.h) starts with a virtual
#                            destructor, so the wrapper's ofi_plugin must have one too.
#   INTERFACE=no-destructor  HCCL <= 1.18 (the wrapper's v1.18.0 tag): no virtual destructor.
#
# A wrong pairing loads fine (both report plugin version 1.2) and then calls every method two vtable
# slots off, so the build has to catch it. The destructor shows as the exported symbol
# _ZN10ofi_pluginD0Ev (ofi_plugin's deleting destructor) whether the library is built with -O0 (the
# wrapper's Makefile) or -O2. Needs nm (binutils).
set -Eeuo pipefail

readonly DESTRUCTOR_SYMBOL=_ZN10ofi_pluginD0Ev
readonly ENTRY_POINTS=(create_ofi_plugin_handle get_version)

die() {
	printf 'check-hccl-ofi-wrapper: error: %s\n' "$*" >&2
	exit 1
}

(($# == 2)) || die "usage: check-hccl-ofi-wrapper.sh LIB destructor|no-destructor"
lib="$1"
interface="$2"
[[ -f "$lib" ]] || die "$lib does not exist"
symbols="$(nm -D --defined-only "$lib" | awk '{print $NF}')" || die "nm cannot read $lib"

for entry in "${ENTRY_POINTS[@]}"; do
	grep -qx "$entry" <<<"$symbols" || die "$lib does not export $entry (HCCL dlsym()s it); is it hccl_ofi_wrapper?"
done
has_destructor=0
grep -qx "$DESTRUCTOR_SYMBOL" <<<"$symbols" && has_destructor=1
case "$interface" in
	destructor)
		((has_destructor)) || die "$lib has no virtual destructor in ofi_plugin ($DESTRUCTOR_SYMBOL), but this Synapse release's HCCL expects one; fix: pin an hccl_ofi_wrapper commit whose hccl_ofi_wrapper_interface.h declares 'virtual ~ofi_plugin_interface() = default;'"
		;;
	no-destructor)
		((!has_destructor)) || die "$lib has a virtual destructor in ofi_plugin ($DESTRUCTOR_SYMBOL), but this Synapse release's HCCL expects none; fix: pin the hccl_ofi_wrapper commit of that release (tag v1.18.0 for 1.18)"
		;;
	*) die "INTERFACE must be destructor or no-destructor, got '$interface'" ;;
esac
printf 'check-hccl-ofi-wrapper: ok: %s has the %s interface\n' "$lib" "$interface" >&2
