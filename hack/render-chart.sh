#!/usr/bin/env bash
# Lints, renders and packages the Helm chart daemonset/helm/migdra, failing on any error or lint
# warning: `helm lint --strict` and `helm template` with the default values and with each
# daemonset/helm/migdra/ci/*-values.yaml (one per kustomize overlay, plus every value away from
# its default), then `helm package` into a temporary directory and `helm template` of the
# package, which must render what the directory does (files/ holds links into daemonset/base/).
# helm is built from its pinned Go module when missing (hack/build-helm.sh, cached outside the
# repo). Prints one line per render: its objects by kind. tests/library/chart.rs compares the renders
# with kustomize's object by object.
#
# Usage: hack/render-chart.sh
# Environment: MIGDRA_HELM (a helm binary to use instead of building one), and
# hack/build-helm.sh's.
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "render-chart: $*" >&2; exit 1; }

helm=${MIGDRA_HELM:-}
if [[ -z $helm ]]; then
	helm=$(bash hack/build-helm.sh | tail -n 1)
fi
[[ -x $helm ]] || die "$helm is not an executable helm"

chart=daemonset/helm/migdra
release=migdra
namespace=migdra-system
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

start=$SECONDS
echo "render-chart: helm $("$helm" version --template '{{.Version}}') ($helm)"
# helm logs an INFO line for each link under files/ on every command: expected, so dropped.
quiet() { grep -v 'found symbolic link in path' >&2 || true; }

values=("")
for f in "$chart"/ci/*-values.yaml; do
	values+=("$f")
done
for v in "${values[@]}"; do
	args=()
	name="defaults"
	if [[ -n $v ]]; then
		args=(-f "$v")
		name=$v
	fi
	"$helm" lint --strict "$chart" "${args[@]}" >"$tmp/lint" 2> >(quiet) ||
		{ cat "$tmp/lint" >&2; die "helm lint --strict $chart ${args[*]} failed"; }
	if ! rendered=$("$helm" template "$release" "$chart" -n "$namespace" "${args[@]}" 2> >(quiet)); then
		die "helm template $chart ${args[*]} failed (see above)"
	fi
	[[ -n $rendered ]] || die "helm template $chart ${args[*]} rendered nothing"
	kinds=$(grep '^kind: ' <<<"$rendered" | cut -d' ' -f2 | sort | uniq -c |
		awk '{ printf "%s%s %d", sep, $2, $1; sep = ", " }')
	echo "render-chart: $name: $kinds"
done

"$helm" package "$chart" -d "$tmp" >/dev/null 2> >(quiet) || die "helm package $chart failed (see above)"
package=$(ls "$tmp"/*.tgz)
from_dir=$("$helm" template "$release" "$chart" -n "$namespace" 2> >(quiet))
from_package=$("$helm" template "$release" "$package" -n "$namespace" 2>&1) ||
	die "helm template of the package $(basename "$package") failed: $from_package"
[[ $from_package == "$from_dir" ]] ||
	die "the package $(basename "$package") renders differently from $chart (are the links under $chart/files/ intact?)"
echo "render-chart: packaged $(basename "$package") ($(du -h "$package" | cut -f1)), renders as the directory does"
echo "render-chart: ${#values[@]} renders in $((SECONDS - start))s"
