#!/usr/bin/env bash
# check-wheelhouse.sh [--missing] LOCK WHEELHOUSE
#
# Compare a lock file (exact `name==version` pins) with the wheel files of a wheelhouse.
# Exit 0 when every pin has exactly one wheel that fits cp311 / x86_64 (or is pure Python);
# otherwise print, on stderr, each missing or unfit pin and the fix, and exit 1.
# Runs on the host (scripts/make-wheelhouse.sh) and inside `docker build` (image/install-python.sh),
# so it needs nothing but bash and coreutils.
# --missing: print the pins without a fitting wheel on stdout (`name==version` a line), exit 0.
set -Eeuo pipefail

readonly PY_TAG_OK='^(py3|py2\.py3|py3\.py2|cp311|py311|cp3[0-9]+-abi3|cp3[0-9]+\.cp311)$'

note() { printf 'check-wheelhouse: %s\n' "$*" >&2; }

# normalize NAME: PEP 503 name normalisation (wheel files write '-' as '_').
normalize() {
	local name="${1,,}"
	name="${name//_/-}"
	name="${name//./-}"
	while [[ "$name" == *--* ]]; do name="${name//--/-}"; done
	printf '%s' "$name"
}

# lock_pins LOCK: print "normalized-name version" for each pin of LOCK.
lock_pins() {
	local line name version
	while IFS= read -r line || [[ -n "$line" ]]; do
		line="${line%%#*}"
		line="${line//[[:space:]]/}"
		[[ -z "$line" ]] && continue
		if [[ "$line" != *==* ]]; then
			note "error: '$line' in $1 is not an exact pin name==version"
			return 1
		fi
		name="${line%%==*}"
		version="${line#*==}"
		printf '%s %s\n' "$(normalize "$name")" "$version"
	done <"$1"
}

# wheel_fits FILE: true when the wheel's tags install on CPython 3.11 x86_64 Linux.
wheel_fits() {
	local base="${1%.whl}" py abi plat
	IFS=- read -r -a parts <<<"$base"
	local n=${#parts[@]}
	((n >= 5)) || return 1
	py="${parts[n - 3]}"
	abi="${parts[n - 2]}"
	plat="${parts[n - 1]}"
	[[ "$py-$abi" =~ ^cp3[0-9]+-abi3$ || "$py" =~ $PY_TAG_OK ]] || return 1
	[[ "$plat" == any || "$plat" == *x86_64* ]] || return 1
	[[ "$plat" == any || "$plat" == *linux* ]]
}

# index_wheels FILE...: fill the global map have[normalized-name]="version version ..." with fitting wheels.
declare -A have=()
index_wheels() {
	local w file name version
	for w in "$@"; do
		file="${w##*/}"
		name="$(normalize "${file%%-*}")"
		version="${file#*-}"
		version="${version%%-*}"
		wheel_fits "$file" || continue
		have["$name"]+="$version "
	done
}

# has_pin NAME VERSION: true when have[] holds VERSION (or VERSION+local, e.g. torch 2.13.0+cpu).
has_pin() {
	local v
	for v in ${have[$1]-}; do
		[[ "$v" == "$2" || "$v" == "$2+"* ]] && return 0
	done
	return 1
}

# missing_from LOCK FILE...: print the pins of LOCK that no fitting FILE provides.
missing_from() {
	local lock="$1" name pinned line
	shift
	index_wheels "$@"
	while IFS= read -r line; do
		line="${line%%#*}"
		line="${line//[[:space:]]/}"
		[[ -z "$line" ]] && continue
		name="$(normalize "${line%%==*}")"
		pinned="${line#*==}"
		has_pin "$name" "$pinned" || printf '%s\n' "$line"
	done <"$lock"
}

main() {
	local list_missing=0
	if [[ "${1-}" == --missing ]]; then
		list_missing=1
		shift
	fi
	if (($# != 2)); then
		note "usage: check-wheelhouse.sh [--missing] LOCK WHEELHOUSE"
		return 2
	fi
	local lock="$1" dir="$2"
	[[ -r "$lock" ]] || {
		note "error: lock file $lock not found"
		return 1
	}
	shopt -s nullglob
	local wheels=("$dir"/*.whl)
	if ((list_missing)); then
		missing_from "$lock" "${wheels[@]}"
		return
	fi
	if ((${#wheels[@]} == 0)); then
		note "error: no wheelhouse: $dir holds no .whl files"
		note "fix: run 'make wheelhouse' (scripts/make-wheelhouse.sh) on the host, then build again"
		return 1
	fi

	index_wheels "${wheels[@]}"
	local missing=0 name pinned
	declare -A wanted=()
	while read -r name pinned; do
		wanted["$name"]=1
		if ! has_pin "$name" "$pinned"; then
			missing=$((missing + 1))
			if [[ -n "${have[$name]-}" ]]; then
				note "mismatch: $name==$pinned is locked, the wheelhouse has $name ${have[$name]% }"
			else
				note "missing: $name==$pinned (no cp311 x86_64 wheel in $dir)"
			fi
		fi
	done < <(lock_pins "$lock")

	for name in "${!have[@]}"; do
		[[ -n "${wanted[$name]-}" ]] || note "note: $name ${have[$name]% } is in the wheelhouse but not in $lock (ignored)"
	done

	if ((missing > 0)); then
		note "error: $missing pin(s) of $lock have no matching wheel in $dir"
		note "fix: run 'make wheelhouse' (scripts/make-wheelhouse.sh) after changing $lock, then build again"
		return 1
	fi
	note "ok: all ${#wanted[@]} pins of $lock have a wheel in $dir"
}

main "$@"
