#!/usr/bin/env bash
# install-python.sh STEP: the Python side of the image, per flavor (FLAVOR from the build args).
#   venv      (builder stage)  cpu: check the wheelhouse against the lock, then make /opt/venv from it,
#                              offline. gaudi: nothing to build (the base's Python is used); an empty
#                              /opt/venv keeps the Dockerfile's COPY --from identical for both flavors.
#   runtime   (final stage)    gaudi: Habana's DeepSpeed fork + optimum-habana and its stack (the profile's
#                              pins, build arguments from app/gaudi_cluster/settings/profiles.json), checked: Habana's
#                              torch untouched, the fork's version and commit; /opt/gaudi-cluster/PROFILE.
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

# dist_version NAME: the installed version of a distribution (package metadata; nothing imported).
dist_version() {
	"$(python)" -c 'import importlib.metadata as m, sys; print(m.version(sys.argv[1]))' "$1"
}

# deepspeed_commit: the commit DeepSpeed's setup.py recorded when pip built it from the git checkout
# (read from the file, because importing deepspeed on the build host would need an HPU accelerator).
deepspeed_commit() {
	"$(python)" - <<'PY'
import importlib.util, pathlib, re
spec = importlib.util.find_spec("deepspeed")
text = (pathlib.Path(next(iter(spec.submodule_search_locations))) / "git_version_info_installed.py").read_text()
match = re.search(r"git_hash\s*=\s*['\"]([0-9a-f]+)['\"]", text)
print(match.group(1) if match else "unknown")
PY
}

install_gaudi_packages() {
	local name torch_before torch_after commit pins=()
	for name in PROFILE PT_VERSION HABANA_DEEPSPEED_REPO HABANA_DEEPSPEED_REF HABANA_DEEPSPEED_VERSION PYTHON_PINS; do
		[[ -n "${!name:-}" ]] || die "FLAVOR=gaudi needs --build-arg $name; fix: build with 'make image PROFILE=...'"
	done
	# A commit, never a branch: make image resolves the branch (git ls-remote) and passes its commit here.
	[[ -n "${HABANA_DEEPSPEED_COMMIT_PREFIX:-}" && "$HABANA_DEEPSPEED_REF" =~ ^[0-9a-f]{40}$ ]] \
		|| die "Habana's DeepSpeed ref '${HABANA_DEEPSPEED_REF}' is not a commit; fix: build with make image (it resolves the branch), or make image HABANA_DEEPSPEED_COMMIT=<full SHA>"
	torch_before="$(dist_version torch)"
	[[ "$torch_before" == "$PT_VERSION"* ]] || die "the base image has torch $torch_before, the profile pins PyTorch $PT_VERSION"
	read -r -a pins <<<"$PYTHON_PINS"
	# HabanaAI/DeepSpeed publishes a branch per Synapse release, no tags: installed by the commit make image
	# chose (the image's label says which). PIP_INDEX_URL / PIP_NO_INDEX + PIP_FIND_LINKS in the base's
	# environment are honoured, so an air-gapped base with a wheel directory builds offline. A bare URL, as
	# in Intel's docs: older pips refuse a PEP 508 "name @ git+file:///..." (no host).
	note "Habana DeepSpeed ${HABANA_DEEPSPEED_REF} from ${HABANA_DEEPSPEED_REPO}"
	PIP_NO_CACHE_DIR=1 "$(python)" -m pip install --disable-pip-version-check \
		"git+${HABANA_DEEPSPEED_REPO}@${HABANA_DEEPSPEED_REF}" "${pins[@]}"
	torch_after="$(dist_version torch)"
	[[ "$torch_after" == "$torch_before" ]] \
		|| die "installing the profile's packages replaced Habana's torch $torch_before with $torch_after; fix: pin packages that accept torch $PT_VERSION"
	# A glob (*+hpu.synapse.vX) where the fork's base version is not recorded.
	# shellcheck disable=SC2053
	[[ "$(dist_version deepspeed)" == $HABANA_DEEPSPEED_VERSION ]] \
		|| die "deepspeed $(dist_version deepspeed) installed, the profile expects $HABANA_DEEPSPEED_VERSION"
	commit="$(deepspeed_commit)"
	[[ ${#commit} -ge 7 && ("$commit" == "$HABANA_DEEPSPEED_COMMIT_PREFIX"* || "$HABANA_DEEPSPEED_COMMIT_PREFIX" == "$commit"*) ]] \
		|| die "Habana's DeepSpeed at ${HABANA_DEEPSPEED_REF} is commit '$commit', the profile expects ${HABANA_DEEPSPEED_COMMIT_PREFIX}...; fix: check the branch and pin its commit in profiles.json"
	for name in "${pins[@]}"; do
		[[ "$(dist_version "${name%%==*}")" == "${name#*==}" ]] || die "${name%%==*} $(dist_version "${name%%==*}") installed, the profile pins ${name#*==}"
	done
	"$(python)" -m pip check || note "warning: pip check reports the conflicts above (the base image's own packages)"
	printf '%s\n' "$PROFILE" >/opt/gaudi-cluster/PROFILE
	# What was really installed, for the build id and a reader: the fork's commit, the fabric, the pins.
	printf '%s\n' "deepspeed $(dist_version deepspeed) $commit" "libfabric ${LIBFABRIC_ROOT:-}" \
		"openmpi ${MPI_ROOT:-}" "${pins[@]}" >/opt/gaudi-cluster/PINS
	note "profile $PROFILE: torch $torch_after, deepspeed $HABANA_DEEPSPEED_VERSION ($commit), ${pins[*]}"
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
	# matplotlib's font cache, built once here: otherwise every fresh container builds it at run time
	# (the master's job report, rank 0's curves), seconds of CPU and a log line each time.
	"$py" -c 'import matplotlib; matplotlib.use("Agg"); import matplotlib.pyplot'
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
