#!/usr/bin/env bash
# standin-base.sh OPENMPI_ROOT LIBFABRIC_ROOT PT_VERSION HABANA_TORCH_PLUGIN_VERSION: TEST-ONLY, run inside
# the stand-in base's build (tests/image/standin/Dockerfile): the vault base's paths, stubs and packages.
set -Eeuo pipefail
mpi="$1" fabric="$2" pt="$3" plugin="$4"

mkdir -p "$mpi/bin" "$fabric/lib" "$fabric/bin"
install -m 0755 /opt/standin/bin/mpirun "$mpi/bin/mpirun"
install -m 0755 /opt/standin/bin/hl-smi /usr/bin/hl-smi
ln -s /usr/lib/x86_64-linux-gnu/libfabric.so.1 "$fabric/lib/libfabric.so.1"
ln -s libfabric.so.1 "$fabric/lib/libfabric.so"
ln -s /usr/bin/fi_info "$fabric/bin/fi_info"
ln -s /usr/include "$fabric/include"

# Habana's base has a `python` (the Dockerfile's RUN steps call it).
ln -sf /usr/bin/python3 /usr/bin/python

site="$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
mkdir -p "$site/habana_frameworks/torch"
printf '"""TEST-ONLY stub of habana_frameworks (gaudi stand-in base)."""\n' >"$site/habana_frameworks/__init__.py"
: >"$site/habana_frameworks/torch/__init__.py"
# Metadata only: what the build reads (importlib.metadata) and what pip sees as installed.
dist() {
	local dir="$site/${1//-/_}-$2.dist-info"
	mkdir -p "$dir"
	printf 'Metadata-Version: 2.1\nName: %s\nVersion: %s\n' "$1" "$2" >"$dir/METADATA"
	printf 'pip\n' >"$dir/INSTALLER"
	: >"$dir/RECORD"
}
dist habana-torch-plugin "$plugin"
# What the vault base has preinstalled and the image uses without installing it: torch (here the CPU
# build PT_VERSION of the wheels), the runtime step's matplotlib.
python3 -m pip install -q --no-cache-dir "torch==$pt" numpy==2.4.6 matplotlib==3.11.2 psutil==7.2.2 PyYAML==6.0.4 packaging==26.4

mkdir -p /etc/profile.d
printf 'export HABANA_LOGS=/var/log/habana_logs\n' >/etc/profile.d/habanalabs.sh
# Habana's base: root's .bashrc sources the profile and starts sshd (the build removes that line).
printf '%s\n' 'source /etc/profile.d/habanalabs.sh' '/etc/init.d/ssh start "-p 3022"' >>/root/.bashrc
# Habana's libraries directory is on the loader's path (HCCL dlopens the wrapper from there).
mkdir -p /usr/lib/habanalabs
printf '/usr/lib/habanalabs\n' >/etc/ld.so.conf.d/habanalabs.conf
ldconfig
