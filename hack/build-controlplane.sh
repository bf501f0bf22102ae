#!/usr/bin/env bash
# Builds the control plane the end-to-end tests run against: kube-apiserver, kube-scheduler,
# kube-controller-manager and etcd, from the Go modules pinned in hack/controlplane-1.36/go.mod and
# hack/etcd/go.mod (with their go.sum). Nothing of their code is in this repo: the go command
# fetches it from the module proxy into its module cache.
#
# The binaries go to a cache outside the repo:
#   ${MIGDRA_CACHE:-$HOME/.cache/migdra}/controlplane-<k8s version>-etcd-<etcd version>-<hash>/bin/
# where <hash> is of both modules' go.mod and go.sum: a changed pin builds anew.
# When all of them are there the build is skipped, so a second run takes a moment.
# The last line printed is that bin directory; everything else goes to stderr, so
#   bin=$(hack/build-controlplane.sh hack/controlplane-1.37)
# works.
#
# Usage: hack/build-controlplane.sh CONTROLPLANE_MODULE_DIR [COMPONENT...]
#   CONTROLPLANE_MODULE_DIR is hack/controlplane-<release> (1.37 or 1.36); another dir of
#   the same shape (a go.mod requiring k8s.io/kubernetes with its staging replaces) builds
#   another version.
#   COMPONENTS default to all four: kube-apiserver kube-scheduler kube-controller-manager etcd;
#   name fewer to build (and wait for) only those, e.g. `hack/controlplane-1.36 kube-apiserver`.
# Environment: MIGDRA_CACHE (see above); GOTOOLCHAIN (default local; a module's `toolchain`
# line overrides it for that module's builds: 1.38's needs Go 1.27); the usual GOCACHE and
# GOMODCACHE, which are outside the repo by default.
set -euo pipefail

hack=$(cd "$(dirname "$0")" && pwd)
[[ $# -ge 1 ]] || { echo "usage: $0 hack/controlplane-<release> [COMPONENT...] (e.g. hack/controlplane-1.37)" >&2; exit 2; }
kube_mod=$(cd "$1" && pwd)
etcd_mod=$hack/etcd

me=build-controlplane
# shellcheck source=hack/lib.sh
source "$hack/lib.sh"

command -v go >/dev/null || die "go is not on PATH; the control plane is built from Go modules (needs Go >= 1.26)"

# The one place each version is written is its go.mod.
pinned() { # pinned GO_MOD MODULE -> version on the line 'require MODULE vX'
	awk -v m="$2" '$1 == "require" && $2 == m { print $3; exit }' "$1"
}
kube_version=$(pinned "$kube_mod/go.mod" k8s.io/kubernetes)
etcd_version=$(pinned "$etcd_mod/go.mod" go.etcd.io/etcd/server/v3)
[[ -n $kube_version ]] || die "no 'require k8s.io/kubernetes vX' line in $kube_mod/go.mod"
[[ -n $etcd_version ]] || die "no 'require go.etcd.io/etcd/server/v3 vX' line in $etcd_mod/go.mod"

cache=${MIGDRA_CACHE:-$HOME/.cache/migdra}
pins=$(cat "$kube_mod/go.mod" "$kube_mod/go.sum" "$etcd_mod/go.mod" "$etcd_mod/go.sum" | sha256sum | cut -c1-12)
bin=$cache/controlplane-$kube_version-etcd-$etcd_version-$pins/bin
all=(kube-apiserver kube-scheduler kube-controller-manager etcd)
components=("${@:2}")
[[ ${#components[@]} -gt 0 ]] || components=("${all[@]}")
for c in "${components[@]}"; do
	[[ " ${all[*]} " == *" $c "* ]] || die "unknown component '$c' (known: ${all[*]})"
done
wanted() { [[ " ${components[*]} " == *" $1 "* ]]; }

all_there() {
	local c
	for c in "${components[@]}"; do [[ -x $bin/$c ]] || return 1; done
}

enter_go_cache "$bin" "${components[*]}" "$bin" all_there

# Version stamps as Kubernetes' own build sets them (its version.sh under hack/lib), so that --version and
# /version say v1.x.y rather than v0.0.0-master. buildDate is the release's time in the proxy.
kube_minor=${kube_version#v1.}
kube_minor=${kube_minor%%.*}
kube_date=$(cd "$kube_mod" && GOTOOLCHAIN=$(go_toolchain go.mod) go list -m -f '{{if .Time}}{{.Time.UTC.Format "2006-01-02T15:04:05Z"}}{{end}}' k8s.io/kubernetes) ||
	die "go list -m k8s.io/kubernetes failed in $kube_mod (module proxy unreachable?)"
kube_ldflags="-s -w"
for pkg in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
	kube_ldflags+=" -X $pkg.gitVersion=$kube_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$kube_minor"
	kube_ldflags+=" -X $pkg.gitTreeState=clean${kube_date:+ -X $pkg.buildDate=$kube_date}"
done
etcd_ldflags="-s -w"

build() { # build NAME MODULE_DIR PACKAGE LDFLAGS
	local name=$1 dir=$2 pkg=$3 ldflags=$4 start tmp
	wanted "$name" || return 0
	if [[ -x $bin/$name ]]; then
		log "$name: already built"
		return
	fi
	log "$name: building $pkg in ${dir#"$hack/"} with GOTOOLCHAIN=$(go_toolchain "$dir/go.mod") ..."
	start=$SECONDS
	tmp=$bin/.$name.tmp
	if ! (cd "$dir" && GOTOOLCHAIN=$(go_toolchain go.mod) go build -trimpath -ldflags="$ldflags" -o "$tmp" "$pkg"); then
		rm -f "$tmp"
		die "$name: 'go build $pkg' in $dir failed (see the errors above)"
	fi
	"$tmp" --version >/dev/null 2>&1 || { rm -f "$tmp"; die "$name: built, but '$name --version' fails"; }
	mv "$tmp" "$bin/$name"
	log "$name: built in $((SECONDS - start))s, $(du -h "$bin/$name" | cut -f1)"
}

total=$SECONDS
build kube-apiserver "$kube_mod" k8s.io/kubernetes/cmd/kube-apiserver "$kube_ldflags"
build kube-scheduler "$kube_mod" k8s.io/kubernetes/cmd/kube-scheduler "$kube_ldflags"
build kube-controller-manager "$kube_mod" k8s.io/kubernetes/cmd/kube-controller-manager "$kube_ldflags"
build etcd "$etcd_mod" go.etcd.io/etcd/server/v3 "$etcd_ldflags"
log "${components[*]} ($kube_version, etcd $etcd_version) ready in $((SECONDS - total))s"
echo "$bin"
