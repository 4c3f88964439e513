#!/usr/bin/env bash
# gaudi-cluster container entrypoint (run by tini as PID 1's only child).
#
#   entrypoint.sh                   role from GAUDI_CLUSTER_ROLE (default: worker)
#   entrypoint.sh worker            host keys, authorized_keys, then sshd in the foreground
#   entrypoint.sh master [JOB...]   same + the client key, sshd in the background (it ends with the
#                                   master), then `gaudi-cluster master JOB...` (the control plane);
#                                   the MPI Operator's launcher, absent from the operator's hostfile
#                                   (it runs no ranks), starts no sshd
#   entrypoint.sh auto [JOB...]     the role an engine gives this node: the MPI Operator's launcher
#                                   (K_MPI_JOB_ROLE), index 0 of an Indexed Job (JOB_COMPLETION_INDEX)
#                                   or node 0 of a Slurm step (SLURM_NODEID) is the master, any other
#                                   node a worker (which ignores JOB); a Slurm worker ends once its
#                                   master releases it or is gone (python -m gaudi_cluster.engines.nodewatch);
#                                   inside Slurm with srun on PATH no node runs sshd: the master starts
#                                   everything by srun steps (GAUDI_CLUSTER_SLURM_LAUNCH=ssh: sshd as before)
#   entrypoint.sh --flag ...        `gaudi-cluster --flag ...` (e.g. --help)
#   entrypoint.sh CMD [ARGS...]     CMD passes through (docker run IMAGE bash -c 'echo ok')
#
# Reads: GAUDI_CLUSTER_ROLE (master | worker | auto), GAUDI_CLUSTER_SSH_PORT (default 3022),
#        GAUDI_CLUSTER_SSH_DIR (default /run/secrets/gaudi-cluster), holding one of two key layouts:
#          ours (make keys): id_ed25519.pub, and id_ed25519 (owner-only) on the master, optional on
#          workers; this node's ssh_host_ed25519_key with its certificate (-cert.pub) and the CA's
#          host_ca.pub (.keys/master on the master, .keys/nodes/NAME on a worker; never .keys itself,
#          which holds the CA's private key: refused);
#          the Kubeflow MPI Operator's Secret: id_rsa (an ECDSA P-521 key in PEM form, whatever its
#          name says), id_rsa.pub and authorized_keys, mode 0644 when mounted away from /root/.ssh.
#        Either way the keys are installed as owner-only copies in /root/.ssh.
#        GAUDI_CLUSTER_MASTER_ENV_DIR (master only; unset: none): one file per variable of the master's
#          environment, named after it (HF_TOKEN), for secrets that must reach no worker's container.
# Bad input (unknown role, missing or unsafe key, bad port): one line naming the culprit and the fix
# on stderr, exit 2, nothing started. Every branch ends in exec.
# Sourceable: `source entrypoint.sh` defines the functions and runs nothing.
set -Eeuo pipefail

readonly EP_ROLES="master worker auto"
EP_SELF="$(readlink -f "${BASH_SOURCE[0]}")"
readonly EP_SELF
readonly EP_DEFAULT_PORT=3022
readonly EP_DEFAULT_SSH_DIR=/run/secrets/gaudi-cluster
readonly EP_KEY_NAME=id_ed25519
# The MPI Operator names its key id_rsa whatever its type (an ECDSA P-521 key).
readonly EP_OPERATOR_KEY_NAME=id_rsa
EP_ROOT_SSH="${EP_ROOT_SSH:-/root/.ssh}"
EP_ETC_SSH="${EP_ETC_SSH:-/etc/ssh}"
readonly EP_SSHD_LOG=/var/log/gaudi-cluster/sshd.log
# Image environment handed to ssh sessions (sshd SetEnv), so that commands run over ssh see the same
# interpreter, libraries and prebuilt extensions as the container itself, and the probe the master
# runs over ssh sees the devices an engine gave this node (HABANA_VISIBLE_DEVICES, SLURM_GPUS_ON_NODE).
readonly EP_SESSION_ENV="PATH LD_LIBRARY_PATH LD_PRELOAD PYTHONPATH TORCH_EXTENSIONS_DIR DS_ACCELERATOR
MPI_ROOT OPAL_PREFIX GC_KERNEL_PATH HABANA_LOGS HABANA_SCAL_BIN_PATH HABANA_PLUGINS_LIB_PATH
RDMAV_FORK_SAFE FI_EFA_USE_DEVICE_RDMA RDMA_CORE_ROOT RDMA_CORE_LIB TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD
HABANA_VISIBLE_DEVICES SLURM_GPUS_ON_NODE
LIBFABRIC_ROOT GAUDI_CLUSTER_SYSFS_ROOT"

# --- logging -------------------------------------------------------------------------------------

ep_log() { printf 'gaudi-cluster[entrypoint]: %s\n' "$*" >&2; }
ep_note() { ep_log "$*"; }
ep_warn() { ep_log "warning: $*"; }
# ep_die MESSAGE [CODE]: one line on stderr, then exit CODE (default 2: bad input).
ep_die() {
	ep_log "error: $1"
	exit "${2:-2}"
}

# --- inputs --------------------------------------------------------------------------------------

# ep_is_role WORD: true when WORD is one of EP_ROLES.
ep_is_role() {
	local r
	for r in $EP_ROLES; do
		[[ "$1" == "$r" ]] && return 0
	done
	return 1
}

# ep_ssh_dir: the directory of the mounted cluster key.
ep_ssh_dir() { printf '%s' "${GAUDI_CLUSTER_SSH_DIR:-$EP_DEFAULT_SSH_DIR}"; }

# ep_ssh_port: GAUDI_CLUSTER_SSH_PORT validated (an integer 1-65535), printed without leading zeros.
ep_ssh_port() {
	local port="${GAUDI_CLUSTER_SSH_PORT:-$EP_DEFAULT_PORT}"
	if [[ ! "$port" =~ ^[0-9]{1,5}$ ]] || ((10#$port < 1 || 10#$port > 65535)); then
		ep_die "GAUDI_CLUSTER_SSH_PORT='$port' is not a TCP port; fix: an integer 1-65535 (default $EP_DEFAULT_PORT)"
	fi
	printf '%d' "$((10#$port))"
}

# ep_file_mode FILE: octal permission bits of FILE (e.g. 600).
ep_file_mode() { stat -L -c '%a' -- "$1"; }

# ep_check_public_key FILE: FILE holds one ed25519, rsa or ecdsa public key.
ep_check_public_key() {
	local file="$1" type rest
	[[ -s "$file" ]] || ep_die "no cluster key at $file; fix: make keys and mount .keys read-only at $(ep_ssh_dir)"
	read -r type rest <"$file" || true
	case "$type" in
		ssh-ed25519 | ssh-rsa | ecdsa-sha2-nistp256 | ecdsa-sha2-nistp384 | ecdsa-sha2-nistp521) ;;
		*) ep_die "$file is not an ed25519, rsa or ecdsa public key (starts with '${type:0:20}'); fix: make keys (scripts/make-keys.sh)" ;;
	esac
	ssh-keygen -l -f "$file" >/dev/null 2>&1 \
		|| ep_die "$file is not a valid $type public key; fix: make keys (scripts/make-keys.sh)"
}

# ep_check_private_key FILE PUBFILE: FILE is readable by its owner only and is the private half of PUBFILE.
ep_check_private_key() {
	local file="$1" pub="$2" mode derived
	[[ -r "$file" ]] || ep_die "$file is not readable; fix: mount the key directory made by 'make keys'"
	mode="$(ep_file_mode "$file")"
	if ((8#$mode & 8#077)); then
		ep_die "$file is readable by others (mode 0$mode); fix: chmod 600 $file (on the host, in .keys/)"
	fi
	derived="$(ssh-keygen -y -f "$file" 2>/dev/null)" \
		|| ep_die "$file is not an unencrypted ssh private key; fix: make keys (scripts/make-keys.sh)"
	local want_type want_key got_type got_key _
	read -r want_type want_key _ <"$pub"
	read -r got_type got_key _ <<<"$derived"
	[[ "$want_type $want_key" == "$got_type $got_key" ]] \
		|| ep_die "$file does not match $pub; fix: mount one key pair made by 'make keys'"
}

# ep_key_name: the key's file name in the key directory: ours (id_ed25519), else the MPI Operator's
# (id_rsa) when only that one is there.
ep_key_name() {
	local dir
	dir="$(ep_ssh_dir)"
	if [[ ! -e "$dir/$EP_KEY_NAME.pub" && -e "$dir/$EP_OPERATOR_KEY_NAME.pub" ]]; then
		printf '%s' "$EP_OPERATOR_KEY_NAME"
	else
		printf '%s' "$EP_KEY_NAME"
	fi
}

# ep_keys_in_place: true when the key directory is /root/.ssh itself (the MPI Operator's default
# mount, read-only, owner-only): then nothing is copied.
ep_keys_in_place() { [[ "$(realpath -m -- "$(ep_ssh_dir)")" == "$(realpath -m -- "$EP_ROOT_SSH")" ]]; }

# ep_validate_keys ROLE: check the mounted secret up front; the master needs the private key. The
# MPI Operator's private key is checked as its installed copy: mounted away from /root/.ssh it is
# readable by others (the operator sets a mode only on /root/.ssh), which ssh-keygen refuses to read.
ep_validate_keys() {
	local role="$1" dir name pub key
	dir="$(ep_ssh_dir)"
	name="$(ep_key_name)"
	pub="$dir/$name.pub"
	key="$dir/$name"
	# The host CA signs every node's certificate: a node holding it could certify itself as any other.
	[[ ! -e "$dir/ca/host_ca" && ! -e "$dir/host_ca" ]] \
		|| ep_die "the host CA's private key is mounted on this node ($dir/ca); fix: mount .keys/master on the master and .keys/nodes/NAME on node NAME, never .keys itself"
	[[ -d "$dir" && -e "$pub" ]] \
		|| ep_die "no cluster key at $pub; fix: make keys and mount .keys read-only at $dir (docker run -v \"\$PWD/.keys:$dir:ro\")"
	ep_check_public_key "$pub"
	if [[ -e "$key" ]]; then
		[[ "$name" == "$EP_OPERATOR_KEY_NAME" ]] || ep_check_private_key "$key" "$pub"
	elif [[ "$role" == master ]]; then
		ep_die "no private key at $key (the master needs it to reach the workers); fix: make keys and mount .keys read-only at $dir"
	fi
	ep_check_own_host_key "$role"
}

# ep_check_own_host_key ROLE: a host key in the key directory must be this node's own: certified by the
# cluster's host CA (host_ca.pub beside it) and, on a worker, for the names this node is reached by.
# Refused: an uncertified key (a key directory from before the host CA: one key on every node) and a
# worker certificate valid for any name (make keys' old nodes/any: one key on every node it served).
ep_check_own_host_key() {
	local role="$1" dir given shown
	dir="$(ep_ssh_dir)"
	given="$dir/ssh_host_ed25519_key"
	[[ -e "$given" ]] || return 0
	local fix="fix: make keys NAMES=<this node's name> and mount .keys/nodes/NAME on it (.keys/master on the master)"
	[[ -s "$given-cert.pub" && -s "$dir/host_ca.pub" ]] \
		|| ep_die "$given has no certificate of the cluster's host CA (a key directory from before the CA: the same host key on every node); $fix"
	shown="$(ssh-keygen -L -f "$given-cert.pub" 2>/dev/null)" \
		|| ep_die "$given-cert.pub is not an ssh certificate; $fix"
	if [[ "$role" != master ]] && grep -q '^[[:space:]]*Principals: (none)' <<<"$shown"; then
		ep_die "$given-cert.pub is valid for any name (make keys' old nodes/any: one host key on every node it served); $fix"
	fi
}

# --- setup ---------------------------------------------------------------------------------------

# ep_install_keys: authorized_keys from the secret, and the client key when the secret has one.
ep_install_keys() {
	local dir name authorized
	dir="$(ep_ssh_dir)"
	name="$(ep_key_name)"
	if ep_keys_in_place; then
		[[ "$name" != "$EP_OPERATOR_KEY_NAME" || ! -e "$dir/$name" ]] \
			|| ep_check_private_key "$dir/$name" "$dir/$name.pub"
		return
	fi
	authorized="$dir/$name.pub"
	[[ "$name" != "$EP_OPERATOR_KEY_NAME" || ! -s "$dir/authorized_keys" ]] || authorized="$dir/authorized_keys"
	install -d -m 0700 "$EP_ROOT_SSH"
	# restrict: the cluster key opens a shell for launches, never a forwarded port, agent or X11.
	sed -E 's/^(ssh-|ecdsa-|sk-)/restrict \1/' "$authorized" >"$EP_ROOT_SSH/authorized_keys"
	chmod 0600 "$EP_ROOT_SSH/authorized_keys"
	if [[ -e "$dir/$name" ]]; then
		install -m 0600 "$dir/$name" "$EP_ROOT_SSH/$name"
		install -m 0644 "$dir/$name.pub" "$EP_ROOT_SSH/$name.pub"
		[[ "$name" != "$EP_OPERATOR_KEY_NAME" ]] || ep_check_private_key "$EP_ROOT_SSH/$name" "$dir/$name.pub"
	fi
}

# ep_host_keys: this node's host key from the secret (make keys: nodes/NAME or master/; checked by
# ep_check_own_host_key) and its certificate, which sshd serves (HostCertificate); clients here pin the
# host CA (@cert-authority). Without one, this container's own key (never in the image), kept across
# restarts, and clients accept a new node's key on first contact. Ed25519 only:
# every client here speaks it, and `ssh-keygen -A` would spend ~0.8 s of CPU on an RSA-3072 key at every
# node start.
ep_host_keys() {
	local key="$EP_ETC_SSH/ssh_host_ed25519_key" dir given pinned cert_conf
	dir="$(ep_ssh_dir)"
	given="$dir/ssh_host_ed25519_key"
	cert_conf="$EP_ETC_SSH/sshd_config.d/20-gaudi-cluster-cert.conf"
	mkdir -p "$EP_ETC_SSH/sshd_config.d"
	rm -f "$cert_conf" "$key-cert.pub"
	if [[ -s "$given" && -s "$given.pub" ]]; then
		install -m 0600 "$given" "$key"
		install -m 0644 "$given.pub" "$key.pub"
		install -m 0644 "$given-cert.pub" "$key-cert.pub"
		printf 'HostCertificate %s\n' "$key-cert.pub" >"$cert_conf"
		# Clients on this node (a user's pdsh or mpirun on a held cluster, mpirun's tree spawn) accept
		# a node certified by the cluster's CA and nothing else.
		pinned="@cert-authority * $(cut -d' ' -f1,2 "$dir/host_ca.pub")"
		printf '%s\n' "$pinned" >"$EP_ETC_SSH/ssh_known_hosts"
		mkdir -p "$EP_ETC_SSH/ssh_config.d"
		printf 'Host *\n    StrictHostKeyChecking yes\n' >"$EP_ETC_SSH/ssh_config.d/05-gaudi-cluster-pinned.conf"
		return
	fi
	[[ -s "$key" ]] || ssh-keygen -q -t ed25519 -N "" -C "" -f "$key"
}

# ep_session_env_line: an sshd `SetEnv` line with the EP_SESSION_ENV variables that are set.
ep_session_env_line() {
	local name value line="SetEnv"
	for name in $EP_SESSION_ENV; do
		[[ -n "${!name-}" ]] || continue
		value="${!name}"
		if [[ "$value" == *[\"\\]* ]]; then
			ep_warn "$name holds a quote or backslash; not passed to ssh sessions"
			continue
		fi
		line+=" \"$name=$value\""
	done
	[[ "$line" == SetEnv ]] || printf '%s\n' "$line"
}

# ep_ssh_runtime_config PORT: drop-ins that depend on the run: the session environment (sshd) and the
# client's default port when it is not the image's.
ep_ssh_runtime_config() {
	local port="$1" client="$EP_ETC_SSH/ssh_config.d/10-gaudi-cluster-port.conf"
	mkdir -p "$EP_ETC_SSH/sshd_config.d" "$EP_ETC_SSH/ssh_config.d"
	ep_session_env_line >"$EP_ETC_SSH/sshd_config.d/10-gaudi-cluster-env.conf"
	if ((port != EP_DEFAULT_PORT)); then
		printf 'Host *\n    Port %d\n' "$port" >"$client"
	else
		rm -f "$client"
	fi
}

# ep_prepare ROLE PORT: everything both roles need before sshd starts.
ep_prepare() {
	local role="$1" port="$2"
	ep_validate_keys "$role"
	ep_install_keys
	ep_host_keys
	ep_ssh_runtime_config "$port"
	mkdir -p /run/sshd /run/gaudi-cluster/jobs "${EP_SSHD_LOG%/*}"
	rm -f /run/gaudi-cluster/healthcheck-banner-*
	chmod 0755 /run/sshd
	/usr/sbin/sshd -t -p "$port" || ep_die "sshd rejects its configuration (see above)" 1
}

# --- roles ---------------------------------------------------------------------------------------

ep_run_worker() {
	local port
	(($# == 0)) || ep_die "the worker role takes no arguments (got: $*); fix: pass job arguments to the master"
	port="$(ep_ssh_port)"
	ep_prepare worker "$port"
	ep_note "worker: sshd on port $port (key-only), waiting for the master"
	exec /usr/sbin/sshd -D -e -p "$port"
}

# ep_run_slurm_worker MASTER_HOST: a worker of a Slurm step that the master reaches over ssh. Slurm
# ends the step only once every task has exited, so sshd runs under nodewatch, which exits once the
# master releases this node or is gone. (A worker the master reaches by srun steps runs no sshd and
# never comes here: `nodewatch auto` follows the master itself.)
ep_run_slurm_worker() {
	local master="$1" port
	port="$(ep_ssh_port)"
	ep_prepare worker "$port"
	exec python3 -m gaudi_cluster.engines.nodewatch follow --master "$master" -- \
		setpriv --pdeathsig TERM -- /usr/sbin/sshd -D -e -p "$port"
}

# ep_wait_listening PORT PID: true once something accepts connections on 127.0.0.1:PORT, false if PID
# exits first or 10 s pass.
ep_wait_listening() {
	local port="$1" pid="$2" tries
	for ((tries = 0; tries < 100; tries++)); do
		if { exec 3<>"/dev/tcp/127.0.0.1/$port"; } 2>/dev/null; then
			exec 3<&-
			return 0
		fi
		kill -0 "$pid" 2>/dev/null || return 1
		sleep 0.1
	done
	return 1
}

# ep_run_srun_master [JOB...]: the master of a Slurm step that reaches the nodes by srun steps
# (nodes/srun): no sshd and no client key; Slurm starts every process.
# ep_master_env: every file NAME in GAUDI_CLUSTER_MASTER_ENV_DIR becomes the variable NAME of the
# master's environment, never a word of a command line (Kubernetes: the Indexed Job's init container
# copies the HF token Secret there on index 0 alone, so no worker's container holds it). Unset: nothing.
ep_master_env() {
	local dir="${GAUDI_CLUSTER_MASTER_ENV_DIR:-}" file name
	[[ -n "$dir" ]] || return 0
	[[ -d "$dir" ]] || ep_die "GAUDI_CLUSTER_MASTER_ENV_DIR=$dir is not a directory; fix: mount one there or unset it"
	for file in "$dir"/*; do
		[[ -f "$file" ]] || continue
		name="${file##*/}"
		[[ "$name" =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] ||
			ep_die "$file: '$name' is not a variable name; fix: name each file after its variable (HF_TOKEN)"
		export "$name=$(<"$file")"
	done
}

ep_run_srun_master() {
	ep_master_env
	mkdir -p /run/gaudi-cluster/jobs
	ep_note "master: no sshd (Slurm starts the processes on every node); starting gaudi-cluster master"
	exec gaudi-cluster master "$@"
}

# ep_master_runs_no_ranks: true for the MPI Operator's launcher when the operator's hostfile does not
# list this pod (the default: the launcher requests no Gaudi). Such a master needs no sshd, and none
# runs: every worker holds the operator's id_rsa, which the launcher's authorized_keys would admit.
ep_master_runs_no_ranks() {
	local hostfile="${OMPI_MCA_orte_default_hostfile:-/etc/mpi/hostfile}" me name _
	[[ "${K_MPI_JOB_ROLE:-}" == launcher && -r "$hostfile" ]] || return 1
	me="$(hostname)"
	while read -r name _; do
		[[ -n "$name" && "$name" != \#* ]] || continue
		[[ "${name%%.*}" != "${me%%.*}" ]] || return 1
	done <"$hostfile"
	return 0
}

ep_run_master() {
	local port sshd_pid
	port="$(ep_ssh_port)"
	ep_master_env
	if ep_master_runs_no_ranks; then
		ep_validate_keys master
		ep_install_keys
		rm -f "$EP_ROOT_SSH/authorized_keys"
		ep_host_keys
		ep_ssh_runtime_config "$port"
		mkdir -p /run/gaudi-cluster/jobs
		ep_note "master: no sshd (the MPI Operator's launcher runs no ranks: not in its hostfile); starting gaudi-cluster master"
		exec gaudi-cluster master "$@"
	fi
	ep_prepare master "$port"
	# sshd as a child that ends with the master (setpriv --pdeathsig; the exec below keeps the parent):
	# where the node outlives the job (a Slurm node, a pyxis container sharing the host's network),
	# a daemonized sshd would hold the port and the step's output open after the job.
	setpriv --pdeathsig TERM -- /usr/sbin/sshd -D -p "$port" -E "$EP_SSHD_LOG" </dev/null &
	sshd_pid=$!
	ep_wait_listening "$port" "$sshd_pid" || ep_die "sshd did not start on port $port; see $EP_SSHD_LOG" 1
	ep_note "master: sshd on port $port (log $EP_SSHD_LOG); starting gaudi-cluster master"
	exec gaudi-cluster master "$@"
}

# ep_run_auto [JOB...]: the role the engine gives this node (see the header). nodewatch decides it and
# comes back here with the answer in GAUDI_CLUSTER_AUTO_ROLE, except as a Slurm worker reached by srun
# steps: that one process then follows the master (one interpreter a node under Slurm, not two).
ep_run_auto() {
	local found="${GAUDI_CLUSTER_AUTO_ROLE:-}" role engine master launch
	if [[ -z "$found" ]]; then
		exec python3 -m gaudi_cluster.engines.nodewatch auto --entrypoint "$EP_SELF" -- "$@"
	fi
	unset GAUDI_CLUSTER_AUTO_ROLE
	read -r role engine master launch <<<"$found"
	case "$role" in
		master)
			if [[ "$engine" == slurm && "$launch" == srun ]]; then
				ep_run_srun_master "$@"
			else
				ep_run_master "$@"
			fi
			;;
		worker)
			(($# == 0)) || ep_note "auto: this node is a worker; the job arguments are the master's: $*"
			if [[ "$engine" == slurm ]]; then
				ep_run_slurm_worker "$master"
			else
				ep_run_worker
			fi
			;;
		*) ep_die "role auto resolved to '$found'; fix: pass the role master or worker" 1 ;;
	esac
}

# ep_role_from_env: GAUDI_CLUSTER_ROLE validated (default worker).
ep_role_from_env() {
	local role="${GAUDI_CLUSTER_ROLE:-worker}"
	ep_is_role "$role" \
		|| ep_die "GAUDI_CLUSTER_ROLE='$role' is not a role; valid roles: ${EP_ROLES// / | }"
	printf '%s' "$role"
}

ep_main() {
	local role
	if (($# > 0)) && ep_is_role "$1"; then
		role="$1"
		shift
		# (said once: not again when nodewatch comes back with role auto's answer)
		if [[ -n "${GAUDI_CLUSTER_ROLE:-}" && "${GAUDI_CLUSTER_ROLE}" != "$role" && -z "${GAUDI_CLUSTER_AUTO_ROLE:-}" ]]; then
			ep_role_from_env >/dev/null
			ep_warn "argument '$role' overrides GAUDI_CLUSTER_ROLE=$GAUDI_CLUSTER_ROLE"
		fi
	elif (($# > 0)) && [[ "$1" == -* ]]; then
		exec gaudi-cluster "$@"
	elif (($# > 0)); then
		command -v -- "$1" >/dev/null 2>&1 \
			|| ep_die "'$1' is neither a role (${EP_ROLES// / | }) nor a command on PATH; fix: docker run IMAGE worker|master [job args] or IMAGE <command>"
		exec "$@"
	else
		role="$(ep_role_from_env)"
	fi
	case "$role" in
		master) ep_run_master "$@" ;;
		worker) ep_run_worker "$@" ;;
		auto) ep_run_auto "$@" ;;
	esac
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
	ep_main "$@"
fi
