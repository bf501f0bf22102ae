#!/usr/bin/env bash
# Builds kustomize from the Go module pinned in hack/kustomize/go.mod (with its go.sum). Nothing
# of its code is in this repo: the go command fetches it from the module proxy into its module
# cache. Debian's kubectl embeds a kustomize too old for daemonset/, hence this build.
#
# The binary goes to a cache outside the repo:
#   ${MIGDRA_CACHE:-$HOME/.cache/migdra}/kustomize-<version>/bin/kustomize
# When it is there the build is skipped. The last line printed is the binary's path; everything
# else goes to stderr, so
#   kustomize=$(hack/build-kustomize.sh)
# works.
#
# Environment: MIGDRA_CACHE (see above); GOTOOLCHAIN (default local); the usual GOCACHE and
# GOMODCACHE, which are outside the repo by default.
set -euo pipefail

hack=$(cd "$(dirname "$0")" && pwd)
mod=$hack/kustomize

me=build-kustomize
# shellcheck source=hack/lib.sh
source "$hack/lib.sh"

command -v go >/dev/null || die "go is not on PATH; kustomize is built from its Go module (needs Go >= 1.26)"

# The one place the version is written is go.mod.
version=$(required_version "$mod/go.mod" sigs.k8s.io/kustomize/kustomize/v5)

bin=${MIGDRA_CACHE:-$HOME/.cache/migdra}/kustomize-$version/bin
out=$bin/kustomize
enter_go_cache "$bin" "kustomize $version" "$out" test -x "$out"
log "kustomize $version: building ..."
start=$SECONDS
tmp=$bin/.kustomize.tmp
# provenance.version is what `kustomize version` prints (kustomize's own release build sets it).
ldflags="-s -w -X sigs.k8s.io/kustomize/api/provenance.version=$version"
if ! (cd "$mod" && go build -trimpath -ldflags="$ldflags" -o "$tmp" sigs.k8s.io/kustomize/kustomize/v5); then
	rm -f "$tmp"
	die "'go build sigs.k8s.io/kustomize/kustomize/v5' in $mod failed (see the errors above)"
fi
"$tmp" version >/dev/null 2>&1 || { rm -f "$tmp"; die "built, but 'kustomize version' fails"; }
mv "$tmp" "$out"
log "kustomize $version: built in $((SECONDS - start))s, $(du -h "$out" | cut -f1)"
echo "$out"
