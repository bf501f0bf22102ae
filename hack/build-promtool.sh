#!/usr/bin/env bash
# Builds promtool from the Go module pinned in hack/promtool/go.mod (with its go.sum), the way
# hack/build-helm.sh builds helm: Prometheus' own rule checker and rule unit tester, which
# tests/library/alerts.rs runs on the chart's alerts. Built with the build tag remove_all_sd
# (Prometheus >= 3.9), which leaves out every service discovery and its cloud SDKs: promtool's
# `check rules` and `test rules` use none, and the build is a fraction of the whole.
#
# The binary goes to a cache outside the repo:
#   ${MIGDRA_CACHE:-$HOME/.cache/migdra}/promtool-<version>/bin/promtool
# When it is there the build is skipped. The last line printed is the binary's path; everything
# else goes to stderr, so
#   promtool=$(hack/build-promtool.sh)
# works.
#
# Environment: MIGDRA_CACHE (see above); GOTOOLCHAIN (default local); the usual GOCACHE and
# GOMODCACHE, which are outside the repo by default.
set -euo pipefail

hack=$(cd "$(dirname "$0")" && pwd)
mod=$hack/promtool

me=build-promtool
# shellcheck source=hack/lib.sh
source "$hack/lib.sh"

command -v go >/dev/null || die "go is not on PATH; promtool is built from its Go module (needs Go >= 1.26)"

# The one place the version is written is go.mod.
module=github.com/prometheus/prometheus
version=$(required_version "$mod/go.mod" $module)

bin=${MIGDRA_CACHE:-$HOME/.cache/migdra}/promtool-$version/bin
out=$bin/promtool
enter_go_cache "$bin" "promtool $version" "$out" test -x "$out"
log "promtool $version: building ..."
start=$SECONDS
tmp=$bin/.promtool.tmp
if ! (cd "$mod" && go build -trimpath -tags remove_all_sd -ldflags="-s -w" -o "$tmp" $module/cmd/promtool); then
	rm -f "$tmp"
	die "'go build $module/cmd/promtool' in $mod failed (see the errors above)"
fi
"$tmp" --help >/dev/null 2>&1 || { rm -f "$tmp"; die "built, but 'promtool --help' fails"; }
mv "$tmp" "$out"
log "promtool $version: built in $((SECONDS - start))s, $(du -h "$out" | cut -f1)"
echo "$out"
