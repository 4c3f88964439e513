#!/usr/bin/env bash
# make-keys.sh [DIR]: the cluster's one ssh key pair (ed25519) in DIR (default .keys, git-ignored).
# DIR 0700, DIR/id_ed25519 0600, DIR/id_ed25519.pub 0644. Idempotent: an existing pair is kept (and its
# modes repaired). Mount DIR read-only at /run/secrets/gaudi-cluster on every node.
# Never prints the private key.
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
