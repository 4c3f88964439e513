#!/usr/bin/env bash
# install-system.sh: the operating-system layer of the image, per flavor. Runs inside `docker build`
# (first RUN of the Dockerfile), as root, with FLAVOR and DS_ACCELERATOR from the build args.
#   cpu    Debian 12: OpenMPI, libfabric tools, rdma-core, sshd, pdsh, tini, Python 3.11 + headers + g++.
#   gaudi  Habana pytorch-installer (Ubuntu 22.04): EFA installer (container mode), libfabric built with
#          SynapseAI support, hccl_ofi_wrapper, the ssh LD_PRELOAD wrapper, pdsh, tini.
# Both: no ssh host keys in the layer (the entrypoint makes them at container start).
set -Eeuo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
readonly VALID_FLAVORS="cpu gaudi"

note() { printf 'install-system: %s\n' "$*" >&2; }
die() {
	printf 'install-system: error: %s\n' "$*" >&2
	exit 1
}

# apt_install PKG...: install without recommends and leave no package lists behind.
apt_install() {
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -q
	apt-get install -y -q --no-install-recommends "$@"
	apt-get clean
	rm -rf /var/lib/apt/lists/*
}

install_cpu() {
	apt_install \
		ca-certificates \
		openssh-server openssh-client \
		openmpi-bin \
		libfabric-bin \
		rdma-core ibverbs-utils \
		pdsh tini iproute2 procps \
		python3 python3-venv python3-dev g++
}

# The gaudi base ships OpenMPI (at $MPI_ROOT), openssh and Python; add what the cluster needs.
install_gaudi() {
	# shellcheck source=image/versions.env
	source "$here/versions.env"
	[[ -n "${MPI_ROOT:-}" ]] || die "MPI_ROOT is not set by the base image $GAUDI_BASE_IMAGE; is BASE_IMAGE a Habana pytorch-installer image?"
	[[ "${DS_ACCELERATOR:-}" == hpu ]] \
		|| die "FLAVOR=gaudi needs --build-arg DS_ACCELERATOR=hpu (got '${DS_ACCELERATOR:-}'); 'make image' passes it"
	apt_install ca-certificates curl openssh-server openssh-client pdsh tini iproute2 procps \
		build-essential bzip2 numactl ethtool
	install_efa "$EFA_INSTALLER_VERSION"
	bash "$here/build-hccl-ofi-wrapper.sh"
	install_ssh_wrapper
}

# install_efa VERSION: AWS EFA user-space in container mode (no kernel module, no ulimit files,
# no device check). Its loader and profile snippets are dropped so that the libfabric built by
# build-hccl-ofi-wrapper.sh is the one on the loader path, as Habana's own images do.
install_efa() {
	local version="$1" dir
	dir="$(mktemp -d)"
	curl -fsSL "https://efa-installer.amazonaws.com/aws-efa-installer-${version}.tar.gz" | tar -xz -C "$dir"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -q
	(cd "$dir/aws-efa-installer" && ./efa_installer.sh -y --skip-kmod --skip-limit-conf --no-verify)
	apt-get clean
	rm -rf /var/lib/apt/lists/* "$dir" /etc/ld.so.conf.d/efa.conf /etc/profile.d/efa.sh
	ldconfig
}

# install_ssh_wrapper: the base preloads tcmalloc (LD_PRELOAD), which breaks ssh started by mpirun/pdsh;
# /usr/local/bin comes first on PATH, so this wrapper is the ssh every launcher runs.
install_ssh_wrapper() {
	printf '%s\n' '#!/bin/sh' '# gaudi-cluster: ssh without the image LD_PRELOAD (tcmalloc breaks ssh).' \
		'unset LD_PRELOAD' 'exec /usr/bin/ssh "$@"' >/usr/local/bin/ssh
	chmod 0755 /usr/local/bin/ssh
}

# common_layout: paths every flavor has; no secrets or host keys in the layer.
common_layout() {
	rm -f /etc/ssh/ssh_host_*
	mkdir -p /etc/ssh/sshd_config.d /etc/ssh/ssh_config.d /run/sshd /workspace /opt/torch-extensions \
		/opt/gaudi-cluster/app /opt/gaudi-cluster/entrypoint /run/gaudi-cluster
	# The drop-ins live with the entrypoint (copied in the last layers); these links make sshd/ssh read them.
	ln -sf /opt/gaudi-cluster/entrypoint/sshd_config /etc/ssh/sshd_config.d/50-gaudi-cluster.conf
	ln -sf /opt/gaudi-cluster/entrypoint/ssh_config /etc/ssh/ssh_config.d/50-gaudi-cluster.conf
	grep -q '^Include /etc/ssh/sshd_config.d/\*\.conf' /etc/ssh/sshd_config \
		|| sed -i '1i Include /etc/ssh/sshd_config.d/*.conf' /etc/ssh/sshd_config
	grep -q '^Include /etc/ssh/ssh_config.d/\*\.conf' /etc/ssh/ssh_config \
		|| sed -i '1i Include /etc/ssh/ssh_config.d/*.conf' /etc/ssh/ssh_config
	# No private key of any kind may ship in a layer.
	rm -rf /root/.ssh
}

main() {
	local flavor="${1:-${FLAVOR:-}}"
	case "$flavor" in
		cpu) install_cpu ;;
		gaudi) install_gaudi ;;
		*) die "unknown FLAVOR '${flavor}'; valid: ${VALID_FLAVORS// / | } (docker build --build-arg FLAVOR=cpu ...)" ;;
	esac
	common_layout
	note "done ($flavor)"
}

main "$@"
