#!/usr/bin/env bash
# Run this server's node of the cluster the way Habana documents its containers.
#
#   scripts/run-node.sh worker
#   GAUDI_CLUSTER_PEERS=10.0.0.2,10.0.0.3 scripts/run-node.sh master [script.py args...]
#
# Variables: GAUDI_CLUSTER_IMAGE (gaudi-cluster:gaudi), GAUDI_CLUSTER_KEYS (.keys),
# GAUDI_CLUSTER_OUTPUT (/data/gaudi-cluster), GAUDI_CLUSTER_RUNTIME (habana; empty for none),
# GAUDI_CLUSTER_PRIVILEGED (1; 0 where the host refuses --privileged: then the capability set below
# plus the EFA devices are passed instead), and any GAUDI_CLUSTER_* setting (passed through).
# DRY_RUN=1 prints the docker command instead of running it.
set -Eeuo pipefail

die() { printf 'run-node: error: %s\n' "$*" >&2; exit 2; }

role="${1:-}"
case "$role" in
master | worker) shift ;;
*) die "first argument must be master or worker, got '${role}'; fix: scripts/run-node.sh worker" ;;
esac

image="${GAUDI_CLUSTER_IMAGE:-gaudi-cluster:gaudi}"
keys="${GAUDI_CLUSTER_KEYS:-$(pwd)/.keys}"
output="${GAUDI_CLUSTER_OUTPUT:-/data/gaudi-cluster}"
runtime="${GAUDI_CLUSTER_RUNTIME-habana}"
[[ -f "$keys/id_ed25519.pub" ]] || die "no cluster key in $keys; fix: make keys NAMES=\"\$(hostname)\" (then copy .keys/master to the master, .keys/nodes/NAME to node NAME)"
# A node mounts only its part of make keys' directory, never the host CA (ca/): the master master/, a
# worker its own nodes/NAME/ (NAME: this host's name), else nodes/any/, else a pre-CA worker/.
if [[ "$role" == master ]]; then
	parts=(master)
else
	parts=("nodes/$(hostname -s)" "nodes/$(hostname -f 2>/dev/null || hostname)" nodes/any worker)
fi
for part in "${parts[@]}"; do
	if [[ -d "$keys/$part" ]]; then
		keys="$keys/$part"
		break
	fi
done
[[ ! -d "$keys/ca" ]] || die "$keys holds the host CA (ca/), which no node may hold; fix: make keys NAMES=\"\$(hostname -s)\" and run again"

args=(run --name "gaudi-cluster-$role" --rm --net=host --ipc=host --cap-add=sys_nice
	--ulimit memlock=-1:-1 --stop-timeout 60
	-e HABANA_VISIBLE_DEVICES=all -e OMPI_MCA_btl_vader_single_copy_mechanism=none
	-v "$keys:/run/secrets/gaudi-cluster:ro" -v "$output:/workspace/output")
[[ -n "$runtime" ]] && args+=(--runtime="$runtime")
if [[ "${GAUDI_CLUSTER_PRIVILEGED:-1}" == 1 ]]; then
	args+=(--privileged)
else
	# Hosts whose capability bounding set lacks CAP_SYS_RESOURCE refuse --privileged.
	args+=(--cap-add ALL --cap-drop SYS_RESOURCE --security-opt seccomp=unconfined)
	# rdma_cm too: librdmacm opens it (verbs and EFA connection setup).
	for device in /dev/infiniband/uverbs* /dev/infiniband/rdma_cm; do
		[[ -e "$device" ]] && args+=(--device "$device")
	done
fi
while IFS='=' read -r name _; do
	args+=(-e "$name")
done < <(env | grep '^GAUDI_CLUSTER_' | grep -v -E '^GAUDI_CLUSTER_(IMAGE|KEYS|OUTPUT|RUNTIME|PRIVILEGED)=')
[[ "$role" == worker ]] && args+=(-d)
args+=("$image" "$role" "$@")

if [[ "${DRY_RUN:-0}" == 1 ]]; then
	printf 'docker'
	printf ' %q' "${args[@]}"
	printf '\n'
	exit 0
fi
exec docker "${args[@]}"
