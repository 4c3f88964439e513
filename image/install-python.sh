#!/usr/bin/env bash
# install-python.sh STEP: the Python side of the image, per flavor (FLAVOR from the build args).
#   venv      (builder stage)  cpu: check the wheelhouse against the lock, then make /opt/venv from it,
#                              offline. gaudi: nothing to build (the base's Python is used); an empty
#                              /opt/venv keeps the Dockerfile's COPY --from identical for both flavors.
#   runtime   (final stage)    gaudi: Habana's DeepSpeed fork + optimum-habana (pinned in versions.env).
#                              both: the .pth that puts /opt/gaudi-cluster/app on sys.path, the
#                              `gaudi-cluster` and `gaudi_spawn.py` launchers.
#   ops       (final stage)    cpu: compile DeepSpeed's shm comm op into $TORCH_EXTENSIONS_DIR so that
#                              no rank JIT-compiles at run time.
set -Eeuo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
readonly VENV=/opt/venv
readonly APP=/opt/gaudi-cluster/app
readonly LOCK="${LOCK:-$here/cpu-image.txt}"
readonly WHEELHOUSE="${WHEELHOUSE:-/tmp/wheelhouse}"

note() { printf 'install-python: %s\n' "$*" >&2; }
die() {
	printf 'install-python: error: %s\n' "$*" >&2
	exit 1
}

flavor() {
	case "${FLAVOR:-}" in
		cpu | gaudi) printf '%s' "$FLAVOR" ;;
		*) die "unknown FLAVOR '${FLAVOR:-}'; valid: cpu | gaudi" ;;
	esac
}

# python: the interpreter every node uses (cpu: the venv; gaudi: the base's python3 with Habana's torch).
python() {
	if [[ "$(flavor)" == cpu ]]; then
		printf '%s' "$VENV/bin/python"
	else
		command -v python3
	fi
}

step_venv() {
	if [[ "$(flavor)" == gaudi ]]; then
		mkdir -p "$VENV"
		return
	fi
	bash "$here/check-wheelhouse.sh" "$LOCK" "$WHEELHOUSE"
	python3 -m venv "$VENV"
	# --no-deps + pip check: the lock alone decides what is installed, and must be closed.
	PIP_NO_CACHE_DIR=1 "$VENV/bin/pip" install --no-index --find-links "$WHEELHOUSE" --no-deps \
		--disable-pip-version-check -r "$LOCK"
	"$VENV/bin/pip" check
}

install_gaudi_packages() {
	# shellcheck source=image/versions.env
	source "$here/versions.env"
	PIP_NO_CACHE_DIR=1 "$(python)" -m pip install --disable-pip-version-check \
		"git+https://github.com/HabanaAI/DeepSpeed.git@${HABANA_DEEPSPEED_REF}" \
		"optimum-habana==${OPTIMUM_HABANA_VERSION}"
}

step_runtime() {
	local py site
	py="$(python)"
	[[ "$(flavor)" == gaudi ]] && install_gaudi_packages
	site="$("$py" -c 'import site; print(site.getsitepackages()[0])')"
	printf '%s\n' "$APP" >"$site/gaudi-cluster.pth"
	printf '%s\n' '#!/bin/sh' '# gaudi-cluster control plane (app/gaudi_cluster), with the image Python.' \
		"exec $py -m gaudi_cluster \"\$@\"" >/usr/local/bin/gaudi-cluster
	chmod 0755 /usr/local/bin/gaudi-cluster
	ln -sf "$APP/gaudi_spawn.py" /usr/local/bin/gaudi_spawn.py
	note "python $py, app on sys.path via $site/gaudi-cluster.pth"
}

step_ops() {
	[[ "$(flavor)" == cpu ]] || return 0
	: "${TORCH_EXTENSIONS_DIR:?TORCH_EXTENSIONS_DIR must be set (Dockerfile ENV)}"
	"$(python)" -c 'from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder; ShareMemCommBuilder().load()'
	ls -l "$TORCH_EXTENSIONS_DIR"/deepspeed_shm_comm/*.so
}

main() {
	case "${1:-}" in
		venv) step_venv ;;
		runtime) step_runtime ;;
		ops) step_ops ;;
		*) die "usage: install-python.sh venv|runtime|ops" ;;
	esac
}

main "$@"
