#!/usr/bin/env bash
# host-tools.sh [TOOL...]: make sure the host tools the build and the tests run here are installed.
#
# Tools (Debian 12 package): debootstrap (debootstrap: the offline base image), ssh and ssh-keygen
# (openssh-client: keys, the AWS tests), pdsh (pdsh: DeepSpeed's multi-node runner, tested on the
# host), mpirun (openmpi-bin: single-node --use_mpi runs on the host, as gaudi_spawn.py users do),
# g++ (g++: the image-script tests compile stand-in libraries).
# Without arguments every tool is checked. As root with apt-get, missing ones are installed; otherwise
# the script stops at once with the exact command to run, so no test fails later for want of a tool.
set -Eeuo pipefail

declare -A package_of=(
	[debootstrap]=debootstrap
	[ssh]=openssh-client
	[ssh-keygen]=openssh-client
	[pdsh]=pdsh
	[mpirun]=openmpi-bin
	[g++]=g++
)

die() {
	printf 'host-tools: error: %s\n' "$*" >&2
	exit 1
}

main() {
	local tools=("$@") tool missing=() packages=()
	((${#tools[@]})) || tools=(debootstrap ssh ssh-keygen pdsh mpirun g++)
	for tool in "${tools[@]}"; do
		[[ -n "${package_of[$tool]-}" ]] || die "unknown tool '$tool'; known: ${!package_of[*]}"
		command -v "$tool" >/dev/null && continue
		missing+=("$tool")
		[[ " ${packages[*]} " == *" ${package_of[$tool]} "* ]] || packages+=("${package_of[$tool]}")
	done
	((${#missing[@]})) || return 0
	local install="apt-get install -y --no-install-recommends ${packages[*]}"
	if [[ $EUID -ne 0 ]] || ! command -v apt-get >/dev/null; then
		die "missing host tools: ${missing[*]}; fix: sudo apt-get update && sudo $install"
	fi
	printf 'host-tools: installing %s (for %s)\n' "${packages[*]}" "${missing[*]}" >&2
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $install -qq >/dev/null \
		|| die "could not install ${packages[*]}; fix: apt-get update && $install"
	for tool in "${missing[@]}"; do
		command -v "$tool" >/dev/null || die "$tool is still missing after installing ${package_of[$tool]}"
	done
}

main "$@"
