#!/usr/bin/env bash
# Builds helm from the Go module pinned in hack/helm/go.mod (with its go.sum), the way
# hack/build-kustomize.sh builds kustomize. Nothing of its code is in this repo: the go command
# fetches it from the module proxy into its module cache. Debian packages no helm, hence this
# build; any helm >= 3.x renders daemonset/helm/migdra the same (the chart is apiVersion v2).
#
# The binary goes to a cache outside the repo:
#   ${MIGDRA_CACHE:-$HOME/.cache/migdra}/helm-<version>/bin/helm
# When it is there the build is skipped. The last line printed is the binary's path; everything
# else goes to stderr, so
#   helm=$(hack/build-helm.sh)
# works.
#
# Environment: MIGDRA_CACHE (see above); GOTOOLCHAIN (default local); the usual GOCACHE and
# GOMODCACHE, which are outside the repo by default.
set -euo pipefail

hack=$(cd "$(dirname "$0")" && pwd)
mod=$hack/helm

me=build-helm
# shellcheck source=hack/lib.sh
source "$hack/lib.sh"

command -v go >/dev/null || die "go is not on PATH; helm is built from its Go module (needs Go >= 1.26)"

# The one place the version is written is go.mod.
version=$(required_version "$mod/go.mod" helm.sh/helm/v4)

bin=${MIGDRA_CACHE:-$HOME/.cache/migdra}/helm-$version/bin
out=$bin/helm
enter_go_cache "$bin" "helm $version" "$out" test -x "$out"
log "helm $version: building ..."
start=$SECONDS
tmp=$bin/.helm.tmp
# internal/version.version is what `helm version` prints; helm's Makefile sets it (and clears
# metadata) for a release build. Without it helm calls itself "v4.3".
ldflags="-s -w -X helm.sh/helm/v4/internal/version.version=$version -X helm.sh/helm/v4/internal/version.metadata="
if ! (cd "$mod" && go build -trimpath -ldflags="$ldflags" -o "$tmp" helm.sh/helm/v4/cmd/helm); then
	rm -f "$tmp"
	die "'go build helm.sh/helm/v4/cmd/helm' in $mod failed (see the errors above)"
fi
printed=$("$tmp" version --template '{{.Version}}' 2>/dev/null) || { rm -f "$tmp"; die "built, but 'helm version' fails"; }
[[ $printed == "$version" ]] || { rm -f "$tmp"; die "built, but 'helm version' prints $printed, not $version"; }
mv "$tmp" "$out"
log "helm $version: built in $((SECONDS - start))s, $(du -h "$out" | cut -f1)"
echo "$out"
