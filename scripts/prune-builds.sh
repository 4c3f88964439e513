#!/usr/bin/env bash
# prune-builds.sh IMAGE REV: after a build, drop the older per-commit tags of IMAGE's series.
#
# Every build also tags the image by commit (gaudi-cluster:0.1.0-cpu-1adc379, …-gaudi-1.24.1-1adc379),
# so `doctor` and a user can name the exact build. Kept forever, each one pins its own copy of the venv
# layer (about 1.5 GB whenever the venv stage was rebuilt), and a developer's or CI's Docker disk fills
# up: a build then dies halfway with "no space left on device". For each tag of IMAGE that ends in -REV,
# this keeps that tag and the KEEP_BUILDS - 1 newest other tags of the same series (default: 2 in all)
# and untags the rest; an image left without a tag is removed by Docker. An image a container still
# uses stays (docker refuses), with a note.
set -Eeuo pipefail

note() { printf 'prune-builds: %s\n' "$*" >&2; }
die() {
	printf 'prune-builds: error: %s\n' "$*" >&2
	exit 1
}

(($# == 2)) || die "usage: prune-builds.sh IMAGE REV (e.g. gaudi-cluster:cpu 1adc379)"
image="$1" rev="$2"
keep="${KEEP_BUILDS:-2}"
[[ "$keep" =~ ^[1-9][0-9]*$ ]] || die "KEEP_BUILDS=$keep: not a whole number >= 1; fix: KEEP_BUILDS=2"

# older_tags REPO SERIES CURRENT: the series' other per-commit tags (SERIES-<rev>, the rev without a dash),
# newest first, past the KEEP - 1 newest.
older_tags() {
	local repo="$1" series="$2" current="$3"
	docker images "$repo" --format '{{.CreatedAt}}	{{.Tag}}' |
		awk -F '\t' -v series="$series-" -v current="$current" '
			index($2, series) == 1 && $2 != current && substr($2, length(series) + 1) !~ /-/ { print }' |
		sort -r | cut -f 2 | tail -n +"$keep"
}

main() {
	local tags ref repo tag series old removed=0
	tags="$(docker image inspect "$image" --format '{{range .RepoTags}}{{println .}}{{end}}' 2>/dev/null)" ||
		die "no image $image; fix: build it first (make image-cpu, make image)"
	while read -r ref; do
		[[ "$ref" == *"-$rev" ]] || continue
		repo="${ref%:*}" tag="${ref##*:}"
		series="${tag%-"$rev"}"
		while read -r old; do
			[[ -n "$old" ]] || continue
			if docker rmi "$repo:$old" >/dev/null 2>&1; then
				removed=$((removed + 1))
			else
				note "kept $repo:$old: a container still uses it (docker rm it, then docker rmi $repo:$old)"
			fi
		done < <(older_tags "$repo" "$series" "$tag")
	done <<<"$tags"
	((removed == 0)) || note "removed $removed older build tag(s) of $image (KEEP_BUILDS=$keep)"
}

main
