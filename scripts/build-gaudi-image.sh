#!/usr/bin/env bash
# build-gaudi-image.sh PROFILE IMAGE_NAME VERSION GIT_REV [profiles_cli docker-build options...]: build the
# gaudi flavor of PROFILE (make image, make image-gaudi-standin). The profile renders the `docker build`
# command and chooses the Habana DeepSpeed commit (given, recorded, the last build's pin file, or
# `git ls-remote` of the branch: app/gaudi_cluster/settings/fork_pin.py), which it prints; after a build
# that succeeded, the commit the image carries in its label io.gaudi-cluster.habana-deepspeed.commit is
# written to the pin file (PINS_DIR/PROFILE.env) so the next build installs the same.
# Then the older per-commit tags of the image go (scripts/prune-builds.sh; KEEP_BUILDS, default 2).
# Environment: PINS_DIR (default build/pins), HABANA_DEEPSPEED_COMMIT, HABANA_DEEPSPEED_REPO, KEEP_BUILDS.
set -Eeuo pipefail

(($# >= 4)) || {
	echo "usage: build-gaudi-image.sh PROFILE IMAGE_NAME VERSION GIT_REV [docker-build options...]" >&2
	exit 2
}
profile="$1" image_name="$2" version="$3" git_rev="$4"
shift 4
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here/.."
pins_dir="${PINS_DIR:-build/pins}"
profiles=(env PYTHONPATH=app python3 -m gaudi_cluster.settings.profiles_cli)

# The command is shell words (shlex.join) on stdout; the summary and the chosen commit go to stderr.
cmd="$("${profiles[@]}" docker-build "$profile" --image-name "$image_name" --version "$version" \
	--git-rev "$git_rev" --deepspeed-commit "${HABANA_DEEPSPEED_COMMIT:-}" \
	--deepspeed-repo "${HABANA_DEEPSPEED_REPO:-}" --pins-dir "$pins_dir" "$@")"
started=$SECONDS
eval "$cmd"
"${profiles[@]}" record-pin "$profile" --image "$image_name:$profile" --pins-dir "$pins_dir"
"$here/prune-builds.sh" "$image_name:$profile" "$git_rev"
printf 'build-gaudi-image: built %s:%s in %d s\n' "$image_name" "$profile" $((SECONDS - started)) >&2
