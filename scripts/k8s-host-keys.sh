#!/usr/bin/env bash
# k8s-host-keys.sh MPIJOB WORKERS [NAMESPACE] [DIR]: one host key per MPIJob worker pod, certified by the
# cluster's host CA (make keys, DIR default .keys) for the names the master reaches it by, laid out as
# the files of the Secret MPIJOB-host-keys (k8s/mpijob, docs/kubernetes.md):
#   DIR/k8s/MPIJOB/host_ca.pub                                the CA the launcher pins (public)
#   DIR/k8s/MPIJOB/id_ed25519.pub                             the client key the workers let in (public)
#   DIR/k8s/MPIJOB/<pod>.ssh_host_ed25519_key (.pub, -cert.pub) worker <pod>'s own host key and certificate
# <pod> is MPIJOB-worker-<i> (the operator's pod names and hostnames), certified for <pod>, <pod>.MPIJOB,
# <pod>.MPIJOB.NAMESPACE.svc (the operator's hostfile) and <pod>.MPIJOB.NAMESPACE.svc.cluster.local.
# The CA's private key never goes into the directory. Then, once per job name (again after changing
# WORKERS or NAMESPACE):
#   kubectl create secret generic MPIJOB-host-keys --from-file=DIR/k8s/MPIJOB
# Bad input: one line naming the culprit and the fix, exit 2. Never prints a private key.
set -Eeuo pipefail

die() {
	printf 'k8s-host-keys: error: %s\n' "$*" >&2
	exit 2
}

(($# >= 2 && $# <= 4)) || die "usage: k8s-host-keys.sh MPIJOB WORKERS [NAMESPACE] [DIR]; fix: e.g. scripts/k8s-host-keys.sh gaudi-cluster-mpi 2 default"
job="$1" workers="$2" namespace="${3:-default}" dir="${4:-.keys}"
# DNS-1035 labels, as Kubernetes requires of both (the pod name <job>-worker-<i> must be one too).
label='^[a-z]([-a-z0-9]*[a-z0-9])?$'
[[ "$job" =~ $label && ${#job} -le 50 ]] || die "'$job' is not an MPIJob name (a DNS label of at most 50 characters); fix: the metadata.name of k8s/mpijob/mpijob.yaml"
[[ "$namespace" =~ $label && ${#namespace} -le 63 ]] || die "'$namespace' is not a namespace name; fix: the namespace the MPIJob runs in"
[[ "$workers" =~ ^[1-9][0-9]{0,3}$ ]] || die "'$workers' is not a worker count (1-9999); fix: the Worker replicas of k8s/mpijob/mpijob.yaml"

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
names=()
for ((i = 0; i < workers; i++)); do
	pod="$job-worker-$i"
	names+=("$pod,$pod.$job,$pod.$job.$namespace.svc,$pod.$job.$namespace.svc.cluster.local")
done
"$here/make-keys.sh" "$dir" "${names[@]}"

out="$dir/k8s/$job"
umask 077
# Made afresh: a worker left over from a larger WORKERS must not stay in the Secret.
rm -rf "$out"
mkdir -p "$out"
chmod 0700 "$dir/k8s" "$out"
install -m 0644 "$dir/ca/host_ca.pub" "$out/host_ca.pub"
install -m 0644 "$dir/id_ed25519.pub" "$out/id_ed25519.pub"
for ((i = 0; i < workers; i++)); do
	pod="$job-worker-$i"
	for file in ssh_host_ed25519_key ssh_host_ed25519_key.pub ssh_host_ed25519_key-cert.pub; do
		install -m 0600 "$dir/nodes/$pod/$file" "$out/$pod.$file"
	done
done
printf 'k8s-host-keys: %s: host keys for %s-worker-0..%d in namespace %s; make the Secret with:\n' "$out" "$job" "$((workers - 1))" "$namespace" >&2
printf '  kubectl create secret generic %s-host-keys --from-file=%s\n' "$job" "$out" >&2
