#!/usr/bin/env bash
# make-keys.sh [DIR] [NAME[,ADDRESS...]...]: the cluster's ssh identity in DIR (default .keys, git-ignored).
# NAMES (space-separated, `make keys NAMES="node-1 node-2,10.0.0.2"`) adds to the NAME arguments.
#   ca/host_ca (+ .pub)    the host CA: it signs every node's host key. It stays on the operator's
#                          machine: never mount ca/ (or DIR itself) on a node; the entrypoint refuses it
#   id_ed25519 (+ .pub)    the master's client key pair (the master logs in to the nodes with it)
#   master/                what the master mounts: the client key pair, host_ca.pub, its own host key and
#                          a certificate valid for any name (the master holds the client key: whoever
#                          has master/ is the master anyway)
#   nodes/NAME/            what node NAME mounts: id_ed25519.pub (the key it lets in), host_ca.pub, its
#                          own host key and a certificate for NAME (and its ADDRESSes, the names the
#                          master reaches it by): `ssh-keygen -s ca/host_ca -h -n NAME[,ADDRESS]`
#   nodes/any/             for nodes the master reaches by names not known in advance (a scaled compose
#                          service found by DNS, reached by address): one host key shared by those
#                          nodes, certified for any name (what a shared host key proved, no more)
#   ssh_host_ed25519_key   the shared host key (+ .pub) of the engines that hand every node the same
#                          files and pin it as `* <key>`: the Kubernetes manifests (one pod template)
#                          and `aws up` (docs/kubernetes.md, docs/aws.md)
# Clients pin `@cert-authority * <host_ca.pub>`: a node is let in by a certificate of this CA naming
# the name the master dialled; no node holds another's host key, and the CA's key is on no node.
# Directories 0700, private keys 0600, public ones 0644. Idempotent: existing keys are kept (and their
# modes repaired); certificates are signed again each run (the principals follow the arguments).
# Never prints a private key.
set -Eeuo pipefail

dir="${1:-.keys}"
(($# == 0)) || shift
# shellcheck disable=SC2206 # NAMES is a space-separated list on purpose
names=("$@" ${NAMES:-})
key="$dir/id_ed25519"
ca="$dir/ca/host_ca"

note() { printf 'make-keys: %s\n' "$*" >&2; }
die() {
	printf 'make-keys: error: %s\n' "$*" >&2
	exit 1
}

# new_key FILE COMMENT: an ed25519 key pair at FILE (kept when there), modes repaired.
new_key() {
	local file="$1" comment="$2"
	if [[ ! -e "$file" ]]; then
		[[ ! -e "$file.pub" ]] || die "$file.pub exists without $file; remove it and run again"
		ssh-keygen -q -t ed25519 -N '' -C "$comment" -f "$file" </dev/null >/dev/null
	fi
	[[ -e "$file.pub" ]] || ssh-keygen -y -f "$file" >"$file.pub" || die "$file is not a usable private key; remove it and run again"
	chmod 0600 "$file"
	chmod 0644 "$file.pub"
}

# node_dir DIR PRINCIPALS: DIR holds what one node mounts; PRINCIPALS empty: valid for any name.
node_dir() {
	local node="$1" principals="$2" identity="$3"
	mkdir -p "$node"
	chmod 0700 "$node"
	new_key "$node/ssh_host_ed25519_key" "gaudi-cluster-host ${identity}"
	rm -f "$node/ssh_host_ed25519_key-cert.pub"
	local sign=(-q -s "$ca" -I "gaudi-cluster-host-$identity" -h)
	[[ -z "$principals" ]] || sign+=(-n "$principals")
	ssh-keygen "${sign[@]}" "$node/ssh_host_ed25519_key.pub" </dev/null >/dev/null 2>&1 \
		|| die "could not sign the host key in $node; fix: remove $node and run again"
	chmod 0644 "$node/ssh_host_ed25519_key-cert.pub"
	install -m 0644 "$key.pub" "$node/id_ed25519.pub"
	install -m 0644 "$ca.pub" "$node/host_ca.pub"
}

for entry in "${names[@]}"; do
	name="${entry%%,*}"
	[[ "$name" =~ ^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$ && "$entry" =~ ^[A-Za-z0-9.,:_-]+$ ]] \
		|| die "'$entry' is not NAME[,ADDRESS...] (a host name, then the addresses the master dials); fix: make keys NAMES=\"node-1 node-2,10.0.0.2\""
	[[ "$name" != any && "$name" != master ]] || die "'$name' is reserved (nodes/any, master/); fix: pick another node name"
done
command -v ssh-keygen >/dev/null || die "ssh-keygen not found; fix: apt-get install -y openssh-client"
umask 077
mkdir -p "$dir" "$dir/ca" "$dir/nodes"
chmod 0700 "$dir" "$dir/ca" "$dir/nodes"

if [[ -e "$key" ]]; then
	note "keeping the existing client key pair in $dir"
else
	note "made a new ed25519 client key pair in $dir"
fi
new_key "$key" gaudi-cluster
ssh-keygen -l -f "$key.pub" >&2
[[ -e "$ca" ]] || note "made the host CA in $dir/ca (keep it here: never mount it on a node)"
new_key "$ca" gaudi-cluster-host-ca

shared="$dir/ssh_host_ed25519_key"
[[ -e "$shared" ]] || note "made the shared host key in $dir (Kubernetes, aws up)"
new_key "$shared" gaudi-cluster-host
node_dir "$dir/master" "" master
install -m 0600 "$key" "$dir/master/id_ed25519"
node_dir "$dir/nodes/any" "" any
for entry in "${names[@]}"; do
	node_dir "$dir/nodes/${entry%%,*}" "$entry" "${entry%%,*}"
done
note "the master mounts $dir/master; node NAME mounts $dir/nodes/NAME (made: ${names[*]:-none}; make keys NAMES=... for more), a node of unknown name $dir/nodes/any"
if [[ -e "$dir/worker" ]]; then
	note "$dir/worker (one host key on every node) is no longer used; fix: mount $dir/nodes/NAME (make keys NAMES=NAME, or nodes/any) on each worker and $dir/master on the master, then remove $dir/worker"
fi
