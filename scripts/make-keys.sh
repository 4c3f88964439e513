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
#                          master reaches it by): `ssh-keygen -s ca/host_ca -h -n NAME[,ADDRESS]`. Nodes
#                          the master reaches at addresses a DNS name gives (a compose service, the
#                          Indexed Job's Service) are named one by one too, each certified for that DNS
#                          name as well (NAME,SERVICE: the master checks such a node against SERVICE)
# Every host key is a node's own: no directory here serves two nodes (no shared host key, no key
# certified for any name on a worker; the entrypoint refuses both). Without NAMES no worker has keys.
# Clients pin `@cert-authority * <host_ca.pub>`: a node is let in by a certificate of this CA naming
# the name the master dialled; no node holds another's host key, and the CA's key is on no node.
# Directories 0700, private keys 0600, public ones 0644. Idempotent: existing keys are kept (and their
# modes repaired); certificates are signed again each run (the principals follow the arguments), each
# replaced whole (a node starting meanwhile reads the old one or the new one). Never prints a private key.
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
	# Signed beside the node's directory, then moved in whole: never a moment without a certificate.
	local staging
	staging="$(mktemp -d "$node/.sign.XXXXXX")"
	cp "$node/ssh_host_ed25519_key.pub" "$staging/key.pub"
	local sign=(-q -s "$ca" -I "gaudi-cluster-host-$identity" -h)
	[[ -z "$principals" ]] || sign+=(-n "$principals")
	if ! ssh-keygen "${sign[@]}" "$staging/key.pub" </dev/null >/dev/null 2>&1; then
		rm -rf "$staging"
		die "could not sign the host key in $node; fix: remove $node and run again"
	fi
	chmod 0644 "$staging/key-cert.pub"
	mv -f "$staging/key-cert.pub" "$node/ssh_host_ed25519_key-cert.pub"
	rm -rf "$staging"
	install -m 0644 "$key.pub" "$node/id_ed25519.pub"
	install -m 0644 "$ca.pub" "$node/host_ca.pub"
}

for entry in "${names[@]}"; do
	name="${entry%%,*}"
	[[ "$name" =~ ^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$ && "$entry" =~ ^[A-Za-z0-9.,:_-]+$ ]] \
		|| die "'$entry' is not NAME[,ADDRESS...] (a host name, then the addresses the master dials); fix: make keys NAMES=\"node-1 node-2,10.0.0.2\""
	[[ "$name" != any && "$name" != master ]] || die "'$name' is reserved (master/, and nodes/any of older runs); fix: pick another node name"
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

node_dir "$dir/master" "" master
install -m 0600 "$key" "$dir/master/id_ed25519"
for entry in "${names[@]}"; do
	node_dir "$dir/nodes/${entry%%,*}" "$entry" "${entry%%,*}"
done
if ((${#names[@]})); then
	note "the master mounts $dir/master; node NAME mounts $dir/nodes/NAME (made: ${names[*]}; make keys NAMES=... for more)"
else
	note "the master mounts $dir/master; no worker has keys yet: each needs its own, fix: make keys NAMES=\"node-1 node-2\" (the names the master dials), then mount $dir/nodes/NAME on node NAME"
fi
# Layouts of older runs that gave several nodes one host key: no longer made, refused by the nodes.
for old in "$dir/worker" "$dir/nodes/any" "$dir/ssh_host_ed25519_key"; do
	if [[ -e "$old" ]]; then
		note "$old (one host key on every node) is no longer used, and a node refuses it; fix: give each node its own (make keys NAMES=NAME, mount $dir/nodes/NAME), then rm -rf $old $old.pub"
	fi
done
