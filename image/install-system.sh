#!/usr/bin/env bash
# install-system.sh: the operating-system layer of the image, per flavor. Runs inside `docker build`
# (first RUN of the Dockerfile), as root, with FLAVOR and DS_ACCELERATOR from the build args.
#   cpu    Debian 12: OpenMPI, libfabric tools, rdma-core, sshd, pdsh, tini, Python 3.11 + headers + g++.
#   gaudi  Habana pytorch-installer (Ubuntu 22.04) of the profile's Synapse release, checked: the base's
#          Open MPI where the profile says ($OPENMPI_ROOT, major $OPENMPI_MAJOR), its one libfabric
#          ($LIBFABRIC_ROOT: the base's EFA installation, or built here from the profile's tarball),
#          hccl_ofi_wrapper at the profile's commit with an ABI check, the ssh LD_PRELOAD wrapper, pdsh,
#          tini; the base's sshd line in .bashrc removed. Every path comes from the profile (build args).
# Both: no ssh host keys in the layer (the entrypoint makes them at container start).
# Sourceable: `source install-system.sh` defines the functions and runs nothing.
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

# The gaudi base ships Open MPI (at $MPI_ROOT), openssh, Python and, up to 1.22, from its own full run of
# the AWS EFA installer, libfabric; from 1.23 on the installer runs --minimal and the profile has this
# build make the one libfabric of the image ($LIBFABRIC_ROOT). Add what the cluster needs.
install_gaudi() {
	local name
	for name in SYNAPSE_VERSION HABANA_TORCH_PLUGIN_VERSION HCCL_OFI_WRAPPER_COMMIT HCCL_OFI_WRAPPER_INTERFACE \
		LIBFABRIC_ROOT LIBFABRIC_SOURCE OPENMPI_ROOT OPENMPI_MAJOR; do
		[[ -n "${!name:-}" ]] || die "FLAVOR=gaudi needs --build-arg $name; fix: build with 'make image PROFILE=...'"
	done
	[[ "${DS_ACCELERATOR:-}" == hpu ]] \
		|| die "FLAVOR=gaudi needs --build-arg DS_ACCELERATOR=hpu (got '${DS_ACCELERATOR:-}'); 'make image' passes it"
	check_synapse_release
	check_openmpi
	apt_install ca-certificates curl git openssh-server openssh-client pdsh tini iproute2 procps \
		build-essential bzip2 numactl ethtool
	case "$LIBFABRIC_SOURCE" in
		build) bash "$here/build-libfabric.sh" ;;
		base) ;;
		*) die "LIBFABRIC_SOURCE='$LIBFABRIC_SOURCE' is not base or build (profiles.json libfabric.from)" ;;
	esac
	check_one_libfabric
	check_efa
	bash "$here/build-hccl-ofi-wrapper.sh"
	remove_bashrc_sshd
	install_ssh_wrapper
}

# check_synapse_release: the base is the profile's Synapse build (habana-torch-plugin is versioned
# <release>.<build>), so a wrong BASE_IMAGE fails here instead of on the first HCCL call.
check_synapse_release() {
	local have
	have="$(python3 -c 'import importlib.metadata as m; print(m.version("habana-torch-plugin"))' 2>/dev/null)" \
		|| die "habana-torch-plugin is not installed in the base image; is BASE_IMAGE a Habana pytorch-installer image?"
	[[ "$have" == "$HABANA_TORCH_PLUGIN_VERSION" ]] \
		|| die "the base image has Synapse $have, the profile pins $HABANA_TORCH_PLUGIN_VERSION (Synapse $SYNAPSE_VERSION); fix: use the profile's base image (make image PROFILE=...)"
	note "Synapse $have (habana-torch-plugin), as the profile pins"
}

# check_openmpi: the base's Open MPI is where the profile says and of the major whose launch flags the
# launchers use (ORTE's on 4, PRRTE's on 5): a base that moved it fails here, not at the first mpirun.
check_openmpi() {
	local have major
	[[ "${MPI_ROOT:-}" == "$OPENMPI_ROOT" ]] \
		|| die "the base image sets MPI_ROOT='${MPI_ROOT:-}', the profile says Open MPI is in $OPENMPI_ROOT; fix: correct openmpi.root in profiles.json"
	[[ -x "$MPI_ROOT/bin/mpirun" ]] || die "no $MPI_ROOT/bin/mpirun in the base image"
	have="$("$MPI_ROOT/bin/mpirun" --version 2>/dev/null | awk '/Open MPI/ {print $NF; exit}')"
	major="${have%%.*}"
	[[ "$major" == "$OPENMPI_MAJOR" ]] \
		|| die "$MPI_ROOT/bin/mpirun is Open MPI '${have:-unknown}', the profile says major $OPENMPI_MAJOR; fix: correct openmpi in profiles.json"
	note "Open MPI $have in $MPI_ROOT, as the profile says"
}

# check_efa: the EFA libraries are where the profile says, or (installer --minimal) the profile expects none.
check_efa() {
	if [[ -n "${EFA_ROOT:-}" ]]; then
		[[ -d "$EFA_ROOT/lib" ]] || die "no EFA libraries in EFA_ROOT=$EFA_ROOT (lib/); fix: correct efa.root in profiles.json"
		note "EFA libraries in $EFA_ROOT"
	else
		note "no EFA libraries expected (the profile's base runs the EFA installer --minimal)"
	fi
}

# check_one_libfabric: $LIBFABRIC_ROOT holds the one libfabric of the image (the base's EFA installation
# is never run again: a second run replaced it under the wrapper's feet). Other copies are named so that
# a reader of the build log sees them; $LIBFABRIC_ROOT/lib comes first on LD_LIBRARY_PATH (Dockerfile ENV).
check_one_libfabric() {
	[[ -e "$LIBFABRIC_ROOT/lib/libfabric.so.1" && -x "$LIBFABRIC_ROOT/bin/fi_info" ]] \
		|| die "no libfabric in LIBFABRIC_ROOT=$LIBFABRIC_ROOT (lib/libfabric.so.1, bin/fi_info); fix: correct libfabric in profiles.json"
	[[ ":$LD_LIBRARY_PATH:" == *":$LIBFABRIC_ROOT/lib:"* ]] || die "$LIBFABRIC_ROOT/lib is not on LD_LIBRARY_PATH (Dockerfile ENV)"
	"$LIBFABRIC_ROOT/bin/fi_info" --version
	local other
	other="$(find /usr /opt -xdev -name 'libfabric.so.1' -not -path "$LIBFABRIC_ROOT/*" 2>/dev/null | paste -sd ' ' -)"
	[[ -z "$other" ]] || note "other libfabric copies (not on LD_LIBRARY_PATH before $LIBFABRIC_ROOT/lib): $other"
}

# remove_bashrc_sshd: Habana's base appends `/etc/init.d/ssh start "-p 3022"` to root's .bashrc and
# comments out its interactivity guard, so every bash that sshd starts (each pdsh, mpirun and probe
# session) would try to start sshd again. Drop that line; keep `source /etc/profile.d/habanalabs.sh`.
remove_bashrc_sshd() {
	local rc="${BASHRC:-/root/.bashrc}"
	[[ -f "$rc" ]] || return 0
	sed -i '\|^[[:space:]]*/etc/init\.d/ssh start|d' "$rc"
	if grep -n 'init\.d/ssh' "$rc"; then
		die "$rc still starts sshd (line above); fix: extend the sed in remove_bashrc_sshd"
	fi
	grep -q 'habanalabs' "$rc" || note "warning: $rc does not source the habanalabs profile"
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

# Sourced (tests): define the functions only.
if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
	main "$@"
fi
