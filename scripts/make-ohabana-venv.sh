#!/usr/bin/env bash
# make-ohabana-venv.sh PROFILE: TEST-ONLY. The venv build/ohabana-PROFILE in which tests/ohabana run the
# workload's Gaudi branch (GaudiTrainer) on CPU with the real optimum-habana of a gaudi image profile:
# requirements/ohabana-PROFILE.txt installed offline from wheels fetched on the host (CPU torch from
# build/wheelhouse, the rest into build/ohabana-wheelhouse), plus a metadata-only habana-torch-plugin
# distribution at the profile's Synapse version, which `import optimum.habana` looks for with `pip list`.
# Nothing here goes into an image. Cached: rebuilt only when the lock or the stub version changes.
set -Eeuo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
profile="${1:?usage: make-ohabana-venv.sh PROFILE (gaudi, gaudi-1.23, dl1: app/gaudi_cluster/settings/profiles.json)}"
lock="$root/requirements/ohabana-$profile.txt"
venv="$root/build/ohabana-$profile"
wheels="$root/build/ohabana-wheelhouse"
python="${PYTHON:-python3}"

note() { printf 'make-ohabana-venv: %s\n' "$*" >&2; }
die() {
	printf 'make-ohabana-venv: error: %s\n' "$*" >&2
	exit 1
}

[[ -r "$lock" ]] || die "no lock $lock; fix: PROFILE must be one of the profiles in app/gaudi_cluster/settings/profiles.json"
plugin="$(PYTHONPATH="$root/app" "$python" -m gaudi_cluster.settings.profiles_cli get "$profile" habana_torch_plugin)"
stamp="$(cat "$lock" <(printf 'habana-torch-plugin %s\n' "$plugin") | sha256sum | cut -c1-16)"
if [[ -f "$venv/.installed" && "$(cat "$venv/.installed")" == "$stamp" ]]; then
	note "$venv is up to date"
	exit 0
fi

# PyPI's torch is the CUDA build: the CPU one comes from the cpu image's wheelhouse only.
compgen -G "$root/build/wheelhouse/torch-*+cpu-*.whl" >/dev/null \
	|| die "no CPU torch wheel in build/wheelhouse; fix: make wheelhouse"
mkdir -p "$wheels"
# The three profiles' venvs are built side by side (tests/ohabana): their fetches into the one shared
# wheelhouse take turns on this lock; the venvs themselves are separate directories.
exec {wheel_lock}>"$wheels.lock"
flock "$wheel_lock"
# The cpu image's wheels (torch's CPU build above all) are reused by hard link, never downloaded twice.
find "$root/build/wheelhouse" -maxdepth 1 -name '*.whl' -exec ln -f -t "$wheels" {} + 2>/dev/null || true
PYTHON="$python" bash "$here/make-wheelhouse.sh" "$lock" "$wheels" 2>&1 | { grep -v '^check-wheelhouse: note:' || true; } >&2
flock -u "$wheel_lock"

note "creating $venv (optimum-habana of the $profile profile, CPU torch; a few minutes the first time)"
rm -rf "$venv"
"$python" -m venv "$venv"
PIP_NO_CACHE_DIR=1 "$venv/bin/pip" install -q --no-index --find-links "$wheels" --no-deps \
	--disable-pip-version-check -r "$lock"
"$venv/bin/pip" check

site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
info="$site/habana_torch_plugin-$plugin.dist-info"
mkdir -p "$info"
printf 'Metadata-Version: 2.1\nName: habana-torch-plugin\nVersion: %s\nSummary: TEST-ONLY metadata stand-in (no code), never shipped\n' \
	"$plugin" >"$info/METADATA"
printf 'gaudi-cluster-tests\n' >"$info/INSTALLER"
printf '%s\n' "${info##*/}/METADATA,," "${info##*/}/INSTALLER,," "${info##*/}/RECORD,," >"$info/RECORD"
listed="$("$venv/bin/pip" list --disable-pip-version-check 2>/dev/null)"
grep -Eq "^habana-torch-plugin +$plugin\$" <<<"$listed" || die "the habana-torch-plugin stand-in is not listed by pip"
printf '%s\n' "$stamp" >"$venv/.installed"
note "ready: $venv"
