#!/usr/bin/env bash
# Make sure a Docker engine answers: install Debian's docker.io and start dockerd when none does.
set -Eeuo pipefail

note() { printf 'start-docker-engine: %s\n' "$*" >&2; }
die() { printf 'start-docker-engine: error: %s\n' "$*" >&2; exit 1; }

if docker info >/dev/null 2>&1; then
	exit 0
fi
[[ $EUID -eq 0 ]] || die "no Docker engine answers and starting one needs root; fix: run as root or start Docker"
if ! command -v dockerd >/dev/null; then
	note "installing docker.io (about a minute)"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io >/dev/null
fi
log="${DOCKERD_LOG:-/tmp/dockerd.log}"
note "starting dockerd (log: $log)"
nohup dockerd >"$log" 2>&1 &
for _ in $(seq 1 60); do
	if docker info >/dev/null 2>&1; then
		note "engine ready"
		exit 0
	fi
	sleep 1
done
tail -20 "$log" >&2 || true
die "dockerd did not answer within 60 s; see $log"
