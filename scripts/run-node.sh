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
# Your code and data, on every node (ranks run on every node: give every node the same):
#   GAUDI_CLUSTER_CODE=DIR     mounted read-only at /workspace/code
#   GAUDI_CLUSTER_DATA=DIR     mounted read-only at /workspace/data
#   GAUDI_CLUSTER_HF_HOME=DIR  the Hugging Face cache, mounted at /workspace/hf (HF_HOME=/workspace/hf)
#   GAUDI_CLUSTER_MOUNTS=SRC:DST[:ro],...  any other host paths
# The master's rank logs and job state (/run/gaudi-cluster/jobs) are kept on the host in
# GAUDI_CLUSTER_JOBS (default: the output directory's jobs/). Secrets such as HF_TOKEN: name them with
# --env-pass NAME or GAUDI_CLUSTER_ENV_PASS=NAME,...; the master's container gets them as `-e NAME`
# (the value from this environment, never on a command line).
# DRY_RUN=1 prints the docker command instead of running it.
set -Eeuo pipefail

die() { printf 'run-node: error: %s\n' "$*" >&2; exit 2; }

# env_pass_names ARGS...: the names the master forwards to its ranks, one a line, read as the master
# reads them: GAUDI_CLUSTER_ENV_PASS and every --env-pass in ARGS (they add up), each a list split at
# ',' or ';', blanks around a name dropped. (slurm/gaudi-cluster.sbatch has the same function.)
env_pass_names() {
	local passed="${GAUDI_CLUSTER_ENV_PASS:-}" next=0 word name names=()
	for word in "$@"; do
		if ((next)); then
			passed+=",$word"
			next=0
		elif [[ "$word" == --env-pass || "$word" == --env_pass ]]; then
			next=1
		elif [[ "$word" == --env-pass=* || "$word" == --env_pass=* ]]; then
			passed+=",${word#*=}"
		fi
	done
	IFS=',;' read -r -a names <<<"$passed"
	for name in "${names[@]}"; do
		name="${name#"${name%%[![:space:]]*}"}"
		name="${name%"${name##*[![:space:]]}"}"
		[[ -z "$name" ]] || printf '%s\n' "$name"
	done
}

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
# worker its own nodes/NAME/ (NAME: this host's name). No part serves two nodes: a worker without its
# own is refused here (make keys' old nodes/any and worker/, one host key for many nodes, are not used).
# A directory without those parts is this node's own (aws up's /opt/gaudi-cluster/keys).
if [[ "$role" == master ]]; then
	parts=(master)
else
	parts=("nodes/$(hostname -s)" "nodes/$(hostname -f 2>/dev/null || hostname)")
fi
found=""
for part in "${parts[@]}"; do
	if [[ -d "$keys/$part" ]]; then
		found="$keys/$part"
		break
	fi
done
if [[ -n "$found" ]]; then
	keys="$found"
elif [[ "$role" == worker && (-d "$keys/master" || -d "$keys/nodes" || -d "$keys/worker") ]]; then
	die "no host key of this node's own in $keys/${parts[0]%/*}/ ($(hostname -s)); fix: make keys NAMES=\"$(hostname -s)\" (add ,ADDRESS for each address the master dials it by), then copy .keys/${parts[0]} here"
fi
[[ ! -d "$keys/ca" ]] || die "$keys holds the host CA (ca/), which no node may hold; fix: make keys NAMES=\"\$(hostname -s)\" and run again"

memlock=-1:-1
if [[ "${GAUDI_CLUSTER_PRIVILEGED:-1}" != 1 && "$(ulimit -H -l)" != unlimited ]]; then
	# Without CAP_SYS_RESOURCE the limit cannot be raised past the host's hard limit (KiB here).
	memlock="$(($(ulimit -H -l) * 1024))"
fi
args=(run --name "gaudi-cluster-$role" --rm --net=host --ipc=host --cap-add=sys_nice
	--ulimit "memlock=$memlock" --stop-timeout 60
	-e HABANA_VISIBLE_DEVICES=all -e OMPI_MCA_btl_vader_single_copy_mechanism=none
	-v "$keys:/run/secrets/gaudi-cluster:ro" -v "$output:/workspace/output")
# dir_mount VARIABLE TARGET [:ro]: the host directory VARIABLE names, at TARGET (when it is set).
dir_mount() {
	local directory="${!1:-}"
	[[ -z "$directory" ]] && return 0
	[[ -d "$directory" ]] || die "$1='$directory' is not a directory; fix: $1=/an/existing/directory"
	args+=(-v "$(cd "$directory" && pwd):$2$3")
}
dir_mount GAUDI_CLUSTER_CODE /workspace/code :ro
dir_mount GAUDI_CLUSTER_DATA /workspace/data :ro
dir_mount GAUDI_CLUSTER_HF_HOME /workspace/hf ""
[[ -z "${GAUDI_CLUSTER_HF_HOME:-}" ]] || args+=(-e HF_HOME=/workspace/hf)
IFS=',' read -r -a mounts <<<"${GAUDI_CLUSTER_MOUNTS:-}"
for mount in "${mounts[@]}"; do
	[[ "$mount" == /*:/* && -e "${mount%%:*}" ]] \
		|| die "GAUDI_CLUSTER_MOUNTS entry '$mount' is not an existing /host/path:/container/path[:ro]; fix: GAUDI_CLUSTER_MOUNTS=/data/set:/workspace/data:ro,/data/hf:/workspace/hf"
	args+=(-v "$mount")
done
if [[ "$role" == master ]]; then
	# The job's directory (rank logs, job_report inputs) outlives the container (--rm) here.
	args+=(-v "${GAUDI_CLUSTER_JOBS:-$output/jobs}:/run/gaudi-cluster/jobs")
	# Names to pass into the master's environment: GAUDI_CLUSTER_ENV_PASS and every --env-pass.
	while IFS= read -r name; do
		[[ "$name" =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] \
			|| die "--env-pass name '$name' is not a variable name; fix: --env-pass HF_TOKEN"
		# By name only: docker reads the value from this environment, so it is on no command line.
		[[ -v "$name" ]] && args+=(-e "$name")
	done < <(env_pass_names "$@")
fi
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
done < <(env | grep '^GAUDI_CLUSTER_' | grep -v -E '^GAUDI_CLUSTER_(IMAGE|KEYS|OUTPUT|RUNTIME|PRIVILEGED|CODE|DATA|HF_HOME|MOUNTS|JOBS)=')
[[ "$role" == worker ]] && args+=(-d)
args+=("$image" "$role" "$@")

if [[ "${DRY_RUN:-0}" == 1 ]]; then
	printf 'docker'
	printf ' %q' "${args[@]}"
	printf '\n'
	exit 0
fi
exec docker "${args[@]}"
