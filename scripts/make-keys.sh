#!/usr/bin/env bash
# make-keys.sh [DIR]: the cluster's ssh identity in DIR (default .keys, git-ignored):
#   id_ed25519 (+ .pub)              the client key pair: the master logs in to the nodes with it
#   ssh_host_ed25519_key (+ .pub)    the cluster's host key: every node's sshd answers with it, and
#                                    clients accept no other (StrictHostKeyChecking yes against it)
#   worker/                          what a worker gets: id_ed25519.pub and the host key, never the
#                                    client's private key
# DIR and DIR/worker 0700, private keys 0600, public ones 0644. Idempotent: existing keys are kept (and
# their modes repaired). Mount DIR read-only at /run/secrets/gaudi-cluster on the master, DIR/worker on
# every worker. A shared host key rather than a host CA: signing each container's key at start would
# need the CA's private key on every node, which is no smaller a secret. Never prints a private key.
set -Eeuo pipefail

dir="${1:-.keys}"
key="$dir/id_ed25519"

note() { printf 'make-keys: %s\n' "$*" >&2; }
die() {
	printf 'make-keys: error: %s\n' "$*" >&2
	exit 1
}

command -v ssh-keygen >/dev/null || die "ssh-keygen not found; fix: apt-get install -y openssh-client"
umask 077
mkdir -p "$dir"
chmod 0700 "$dir"

if [[ -e "$key" ]]; then
	[[ -e "$key.pub" ]] || ssh-keygen -y -f "$key" >"$key.pub" || die "$key is not a usable private key; remove it and run again"
	note "keeping the existing key pair in $dir"
else
	[[ ! -e "$key.pub" ]] || die "$key.pub exists without $key; remove it and run again"
	ssh-keygen -q -t ed25519 -N '' -C gaudi-cluster -f "$key" </dev/null >/dev/null
	note "made a new ed25519 key pair in $dir"
fi
chmod 0600 "$key"
chmod 0644 "$key.pub"
ssh-keygen -l -f "$key.pub" >&2

host_key="$dir/ssh_host_ed25519_key"
if [[ ! -e "$host_key" ]]; then
	ssh-keygen -q -t ed25519 -N '' -C gaudi-cluster-host -f "$host_key" </dev/null >/dev/null
	note "made the cluster's host key in $dir"
fi
[[ -e "$host_key.pub" ]] || ssh-keygen -y -f "$host_key" >"$host_key.pub"
chmod 0600 "$host_key"
chmod 0644 "$host_key.pub"

worker="$dir/worker"
mkdir -p "$worker"
chmod 0700 "$worker"
for file in id_ed25519.pub ssh_host_ed25519_key ssh_host_ed25519_key.pub; do
	cp -p "$dir/$file" "$worker/$file"
done
note "workers get $worker (public key and host key only)"
