#!/usr/bin/env bash
# Builds migdra-kubelet, the kubelet's own plugin manager, DRA manager and the CDI library in one
# program (hack/kubelet-1.36/main.go), which tests/kubelet_code.rs drives as the client of migdra's
# sockets. Its Kubernetes code comes from the Go modules pinned in the module dir's go.mod and
# go.sum, fetched by the go command into its module cache; none of it is in this repo.
#
# The binary goes to a cache outside the repo:
#   ${MIGDRA_CACHE:-$HOME/.cache/migdra}/kubelet-<k8s version>-<hash>/bin/migdra-kubelet
# where <hash> is of the module dir's files (symlinks followed), so a changed main.go builds
# anew and an unchanged one is not built again. The last line printed is that bin directory;
# everything else goes to stderr, so
#   bin=$(hack/build-kubelet.sh hack/kubelet-1.37)
# works.
#
# Usage: hack/build-kubelet.sh MODULE_DIR
#   MODULE_DIR is hack/kubelet-<release> (1.37 or 1.36): the same program against the
#   kubelet code of that release.
# Environment: MIGDRA_CACHE (see above); GOTOOLCHAIN (default local; the module's `toolchain`
# line overrides it: 1.38's needs Go 1.27); the usual GOCACHE and
# GOMODCACHE, which are outside the repo by default.
set -euo pipefail

hack=$(cd "$(dirname "$0")" && pwd)
[[ $# -ge 1 ]] || { echo "usage: $0 hack/kubelet-<release> (e.g. hack/kubelet-1.37)" >&2; exit 2; }
mod=$(cd "$1" && pwd)

me=build-kubelet
# shellcheck source=hack/lib.sh
source "$hack/lib.sh"

command -v go >/dev/null || die "go is not on PATH; migdra-kubelet is built from Go modules (needs Go >= 1.26)"

kube_version=$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v/ { print $2; exit } $1 == "require" && $2 == "k8s.io/kubernetes" { print $3; exit }' "$mod/go.mod")
[[ -n $kube_version ]] || die "no k8s.io/kubernetes requirement in $mod/go.mod"

# Names and contents of every file in the module dir, in a fixed order; -L reads through
# hack/kubelet-1.37/main.go, a symlink to hack/kubelet-1.36/main.go.
hash=$(cd "$mod" && find -L . -type f ! -name '.*' | LC_ALL=C sort | while read -r f; do
	printf '%s\n' "$f"
	cat "$f"
done | sha256sum | cut -c1-12)

cache=${MIGDRA_CACHE:-$HOME/.cache/migdra}
bin=$cache/kubelet-$kube_version-$hash/bin
name=migdra-kubelet

enter_go_cache "$bin" "$name ($kube_version)" "$bin" test -x "$bin/$name"
log "$name: building ${mod#"$hack/"} against k8s.io/kubernetes $kube_version" \
	"with GOTOOLCHAIN=$(go_toolchain "$mod/go.mod") ..."
start=$SECONDS
tmp=$bin/.$name.tmp
if ! (cd "$mod" && GOTOOLCHAIN=$(go_toolchain go.mod) go build -trimpath -ldflags="-s -w" -o "$tmp" .); then
	rm -f "$tmp"
	die "$name: 'go build' in $mod failed (see the errors above)"
fi
# A binary that does not even parse its flags would fail every test in a confusing way.
"$tmp" -h >/dev/null 2>&1 || [[ $? -eq 2 ]] || { rm -f "$tmp"; die "$name: built, but '$name -h' fails"; }
mv "$tmp" "$bin/$name"
log "$name ($kube_version): built in $((SECONDS - start))s, $(du -h "$bin/$name" | cut -f1), in $bin"
echo "$bin"
