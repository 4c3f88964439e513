#!/usr/bin/env bash
# k8s-host-keys.sh MPIJOB WORKERS [NAMESPACE] [DIR]
# k8s-host-keys.sh --indexed-job JOB NODES [NAMESPACE] [DIR]
# One host key per pod that runs sshd, certified by the cluster's host CA (make keys, DIR default .keys)
# for the names the master reaches it by, laid out as the files of the Secret <name>-host-keys
# (k8s/mpijob, k8s/indexed-job, docs/kubernetes.md):
#   DIR/k8s/<name>/host_ca.pub                                the CA the master pins (public)
#   DIR/k8s/<name>/id_ed25519.pub                             the client key the nodes let in (public)
#   DIR/k8s/<name>/<pod>.ssh_host_ed25519_key (.pub, -cert.pub) pod <pod>'s own host key and certificate
# MPIJob: <pod> is MPIJOB-worker-<i> (the operator's pod names and hostnames), certified for <pod>,
# <pod>.MPIJOB, <pod>.MPIJOB.NAMESPACE.svc (the operator's hostfile) and <pod>.MPIJOB.NAMESPACE.svc.cluster.local.
# Indexed Job: <pod> is JOB-<i> for every index (the master, index 0, too), certified for <pod>,
# <pod>.SERVICE, <pod>.SERVICE.NAMESPACE.svc(.cluster.local) and SERVICE itself: the master finds the
# pods at the Service's addresses (GAUDI_CLUSTER_PEERS_DNS) and checks each against SERVICE (its name,
# environment SERVICE, default JOB: k8s/indexed-job names both gaudi-cluster).
# No two pods get the same key; each pod's init container copies its own. The CA's private key never
# goes into the directory. Then, once per job name (again after changing the count or the namespace):
#   kubectl create secret generic <name>-host-keys --from-file=DIR/k8s/<name>
# Bad input: one line naming the culprit and the fix, exit 2. Never prints a private key.
set -Eeuo pipefail

die() {
	printf 'k8s-host-keys: error: %s\n' "$*" >&2
	exit 2
}

kind=mpijob
if [[ "${1:-}" == --indexed-job ]]; then
	kind=indexed-job
	shift
fi
(($# >= 2 && $# <= 4)) || die "usage: k8s-host-keys.sh [--indexed-job] NAME COUNT [NAMESPACE] [DIR]; fix: e.g. scripts/k8s-host-keys.sh gaudi-cluster-mpi 2 default, or scripts/k8s-host-keys.sh --indexed-job gaudi-cluster 2 default"
job="$1" count="$2" namespace="${3:-default}" dir="${4:-.keys}"
# DNS-1035 labels, as Kubernetes requires of both (the pod names made of them must be labels too).
label='^[a-z]([-a-z0-9]*[a-z0-9])?$'
[[ "$namespace" =~ $label && ${#namespace} -le 63 ]] || die "'$namespace' is not a namespace name; fix: the namespace the job runs in"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
pods=() names=()
if [[ "$kind" == mpijob ]]; then
	[[ "$job" =~ $label && ${#job} -le 50 ]] || die "'$job' is not an MPIJob name (a DNS label of at most 50 characters); fix: the metadata.name of k8s/mpijob/mpijob.yaml"
	[[ "$count" =~ ^[1-9][0-9]{0,3}$ ]] || die "'$count' is not a worker count (1-9999); fix: the Worker replicas of k8s/mpijob/mpijob.yaml"
	for ((i = 0; i < count; i++)); do
		pod="$job-worker-$i"
		pods+=("$pod")
		names+=("$pod,$pod.$job,$pod.$job.$namespace.svc,$pod.$job.$namespace.svc.cluster.local")
	done
else
	service="${SERVICE:-$job}"
	[[ "$job" =~ $label && ${#job} -le 50 ]] || die "'$job' is not a Job name (a DNS label of at most 50 characters); fix: the metadata.name of k8s/indexed-job/job.yaml"
	[[ "$service" =~ $label && ${#service} -le 63 ]] || die "SERVICE='$service' is not a Service name; fix: the metadata.name of k8s/indexed-job/service.yaml"
	[[ "$count" =~ ^[1-9][0-9]{0,3}$ ]] || die "'$count' is not a node count (1-9999); fix: the completions of k8s/indexed-job/job.yaml"
	for ((i = 0; i < count; i++)); do
		pod="$job-$i"
		pods+=("$pod")
		names+=("$pod,$pod.$service,$pod.$service.$namespace.svc,$pod.$service.$namespace.svc.cluster.local,$service")
	done
fi
"$here/make-keys.sh" "$dir" "${names[@]}"

out="$dir/k8s/$job"
umask 077
# Made afresh: a pod left over from a larger count must not stay in the Secret.
rm -rf "$out"
mkdir -p "$out"
chmod 0700 "$dir/k8s" "$out"
install -m 0644 "$dir/ca/host_ca.pub" "$out/host_ca.pub"
install -m 0644 "$dir/id_ed25519.pub" "$out/id_ed25519.pub"
for pod in "${pods[@]}"; do
	for file in ssh_host_ed25519_key ssh_host_ed25519_key.pub ssh_host_ed25519_key-cert.pub; do
		install -m 0600 "$dir/nodes/$pod/$file" "$out/$pod.$file"
	done
done
printf 'k8s-host-keys: %s: host keys for %s..%s in namespace %s; make the Secret with:\n' "$out" "${pods[0]}" "${pods[-1]}" "$namespace" >&2
printf '  kubectl create secret generic %s-host-keys --from-file=%s\n' "$job" "$out" >&2
