#!/usr/bin/env bash
# Renders daemonset/ with kustomize, failing on any error: the base as an admin applies it
# (daemonset/), each overlay under daemonset/overlays/, and daemonset/examples/. kustomize is built
# from its pinned Go module when missing (hack/build-kustomize.sh, cached outside the repo).
# Prints one line per directory: its objects by kind. tests/library/manifests.rs then parses the same
# renders into the typed Kubernetes objects (it finds the binary in the same cache, or in
# MIGDRA_KUSTOMIZE).
#
# Usage: hack/render-daemonset.sh [OUT_DIR]
#   OUT_DIR: also write each render there, as <dir with / turned into _>.yaml.
# Environment: MIGDRA_KUSTOMIZE (a kustomize binary to use instead of building one), and
# hack/build-kustomize.sh's.
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "render-daemonset: $*" >&2; exit 1; }

kustomize=${MIGDRA_KUSTOMIZE:-}
if [[ -z $kustomize ]]; then
	kustomize=$(bash hack/build-kustomize.sh | tail -n 1)
fi
[[ -x $kustomize ]] || die "$kustomize is not an executable kustomize"
out_dir=${1:-}
[[ -z $out_dir ]] || mkdir -p "$out_dir"

dirs=(daemonset)
for d in daemonset/overlays/*/ daemonset/examples/; do
	[[ -f $d/kustomization.yaml ]] && dirs+=("${d%/}")
done

start=$SECONDS
echo "render-daemonset: $("$kustomize" version) ($kustomize)"
for d in "${dirs[@]}"; do
	if ! rendered=$("$kustomize" build "$d"); then
		die "kustomize build $d failed (see above)"
	fi
	[[ -n $rendered ]] || die "kustomize build $d rendered nothing"
	kinds=$(grep '^kind: ' <<<"$rendered" | cut -d' ' -f2 | sort | uniq -c |
		awk '{ printf "%s%s %d", sep, $2, $1; sep = ", " }')
	echo "render-daemonset: $d: $kinds"
	[[ -z $out_dir ]] || printf '%s\n' "$rendered" >"$out_dir/${d//\//_}.yaml"
done
echo "render-daemonset: ${#dirs[@]} renders in $((SECONDS - start))s"
