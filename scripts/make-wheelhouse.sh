#!/usr/bin/env bash
# make-wheelhouse.sh [LOCK] [OUT]
#
# Fill OUT (default build/wheelhouse, git-ignored) on the host with exactly the wheels that LOCK
# (default requirements/cpu-image.txt) pins, for the cpu image's interpreter: CPython 3.11,
# manylinux x86_64. The image installs them offline (pip does not reach PyPI inside containers).
# Pins with no binary wheel (deepspeed ships an sdist) are built here with `pip wheel --no-deps`.
# Idempotent: pins that already have a wheel are skipped. Ends by checking OUT against LOCK.
set -Eeuo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
lock="${1:-$root/requirements/cpu-image.txt}"
out="${2:-$root/build/wheelhouse}"
python="${PYTHON:-$root/.venv/bin/python}"
check="$root/image/check-wheelhouse.sh"

note() { printf 'make-wheelhouse: %s\n' "$*" >&2; }
die() {
	printf 'make-wheelhouse: error: %s\n' "$*" >&2
	exit 1
}

# The tags of the image's interpreter (Debian 12: python3.11, glibc 2.36).
readonly TARGET=(
	--python-version 3.11 --implementation cp --abi cp311 --abi abi3 --abi none
	--platform manylinux_2_36_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
	--platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
	--platform manylinux_2_12_x86_64 --platform manylinux2010_x86_64 --platform manylinux1_x86_64
	--platform linux_x86_64 --platform any
)

# missing_pins: the pins of $lock without a fitting wheel in $out, one `name==version` a line.
missing_pins() {
	bash "$check" --missing "$lock" "$out"
}

# fetch_binary PIN...: download binary wheels for the target without resolving dependencies
# (the lock already lists every dependency).
fetch_binary() {
	# Not --quiet: pip names each wheel as it downloads it (with a progress bar on a terminal).
	"$python" -m pip download --no-deps --only-binary=:all: "${TARGET[@]}" -d "$out" "$@"
}

# build_wheel PIN: build a wheel from an sdist with the host venv (deepspeed imports torch in setup.py).
build_wheel() {
	note "building a wheel for $1 from its sdist"
	"$python" -m pip wheel --quiet --no-deps --no-build-isolation -w "$out" "$1"
}

main() {
	[[ -x "$python" ]] || die "no Python at $python; fix: make venv (or set PYTHON=/path/to/python3.11)"
	[[ -r "$lock" ]] || die "lock file $lock not found"
	mkdir -p "$out"

	local pins=() pin
	mapfile -t pins < <(missing_pins)
	if ((${#pins[@]} == 0)); then
		note "wheelhouse $out is complete"
		bash "$check" "$lock" "$out"
		return
	fi
	note "fetching ${#pins[@]} wheel(s) into $out (the first time: about 1.5 GB, a few minutes)"
	if ! fetch_binary "${pins[@]}" 2>/dev/null; then
		# One pin without a binary wheel fails the whole batch: go one by one.
		for pin in "${pins[@]}"; do
			fetch_binary "$pin" 2>/dev/null || build_wheel "$pin"
		done
	fi
	if ! bash "$check" "$lock" "$out"; then
		die "the wheelhouse $out still lacks the pins listed above; check that pip on this host reaches an index"
	fi
}

main "$@"
