#!/usr/bin/env bash
# gaudi-cluster HEALTHCHECK: healthy when this node can be reached by the launchers, i.e. the cluster
# key is installed in authorized_keys AND sshd answers with an SSH banner on GAUDI_CLUSTER_SSH_PORT
# (default 3022). Prints one line saying why when unhealthy.
#
# Each banner check is a connection that sshd logs (two lines on the worker's stderr). To keep
# `docker logs` readable when the check runs often (the test harness runs it on demand), a banner
# check that passed is remembered for BANNER_EVERY seconds; in between, the check is that a socket
# still LISTENs on the port.
set -Eeuo pipefail

readonly AUTHORIZED_KEYS="${HEALTHCHECK_AUTHORIZED_KEYS:-/root/.ssh/authorized_keys}"
readonly HOST=127.0.0.1
readonly MARK_DIR="${HEALTHCHECK_STATE_DIR:-/run/gaudi-cluster}"
readonly BANNER_EVERY="${HEALTHCHECK_BANNER_EVERY:-60}"

unhealthy() {
	printf 'unhealthy: %s\n' "$*"
	exit 1
}

# listening PORT: true when a TCP socket (v4 or v6) is in state LISTEN (0A) on PORT.
listening() {
	local hex table tables=()
	hex="$(printf ':%04X' "$1")"
	for table in /proc/net/tcp /proc/net/tcp6; do
		[[ -r "$table" ]] && tables+=("$table")
	done
	awk -v p="$hex" '$2 ~ p"$" && $4 == "0A" {found = 1} END {exit !found}' "${tables[@]}"
}

# banner PORT: read the server's identification line into BANNER.
BANNER=""
banner() {
	{ exec 3<>"/dev/tcp/$HOST/$1"; } 2>/dev/null || unhealthy "nothing listens on $HOST:$1"
	read -r -t 2 BANNER <&3 || true
	exec 3<&-
	BANNER="${BANNER%$'\r'}"
	[[ "$BANNER" == SSH-2.0-* ]] || unhealthy "$HOST:$1 does not answer with an SSH banner"
}

main() {
	local port="${GAUDI_CLUSTER_SSH_PORT:-3022}" mark now
	[[ -s "$AUTHORIZED_KEYS" ]] || unhealthy "no cluster key installed at $AUTHORIZED_KEYS"
	mark="$MARK_DIR/healthcheck-banner-$port"
	now="$(date +%s)"
	if [[ -f "$mark" ]] && ((now - $(stat -c %Y "$mark") < BANNER_EVERY)); then
		listening "$port" || unhealthy "nothing listens on port $port any more"
		printf 'healthy: port %s listening (banner seen %ss ago)\n' "$port" "$((now - $(stat -c %Y "$mark")))"
		return
	fi
	banner "$port"
	mkdir -p "$MARK_DIR" && touch "$mark"
	printf 'healthy: %s on port %s\n' "$BANNER" "$port"
}

main "$@"
