#!/usr/bin/env bash
# Builds a real Kubernetes node for tests/node/ and `hack/node-up.sh`: the kubelet binary and
# kubectl (Kubernetes' own commands, from the module set of a control plane,
# hack/controlplane-1.37 unless named, so they share that control plane's Go build cache),
# containerd with its runc shim and ctr, runc, and crictl.
# Nothing of their code is in this repo: the go command fetches it from the module proxy.
#
# Why these builds and not Debian's packages: Debian 12's runc (1.1.5) and crun (1.8.1) are too old
# for containerd 2.x (runtime-spec 1.3.0), and Debian has no kubelet, containerd 2 or crictl.
#
# The binaries go to a cache outside the repo:
#   ${MIGDRA_CACHE:-$HOME/.cache/migdra}/node-<kubernetes>-containerd-<v>-runc-<v>-crictl-<v>/bin/
# When all of them are there the build is skipped. The last line printed is that bin directory;
# everything else goes to stderr, so `bin=$(hack/build-node.sh)` works.
#
# Needs: go (>= 1.26), a C compiler, pkg-config and libseccomp-dev (runc is built with seccomp,
# as its releases are); .ci/run installs them.
# Usage: hack/build-node.sh [CONTROLPLANE_MODULE_DIR]   (default hack/controlplane-1.37;
#   hack/controlplane-1.38 builds the 1.38 kubelet, whose iptables module the proxy refuses and
#   that module replaces with hack/node/no-iptables: a node without iptables)
# Environment: MIGDRA_CACHE; GOTOOLCHAIN (default local; the module's `toolchain` line overrides it
# for the kubelet and kubectl: 1.38's needs Go 1.27); the usual GOCACHE and GOMODCACHE.
set -euo pipefail

hack=$(cd "$(dirname "$0")" && pwd)
kube_mod=$(cd "${1:-$hack/controlplane-1.37}" && pwd)
me=build-node
# shellcheck source=hack/lib.sh
source "$hack/lib.sh"

# The versions of the pieces that are not Kubernetes; Kubernetes' is the one in $kube_mod/go.mod.
containerd_version=v2.4.2
runc_version=v1.5.3
crictl_version=v1.37.0

command -v go >/dev/null || die "go is not on PATH; the node is built from Go modules (needs Go >= 1.26)"
kube_version=$(required_version "$kube_mod/go.mod" k8s.io/kubernetes)

cache=${MIGDRA_CACHE:-$HOME/.cache/migdra}
bin=$cache/node-$kube_version-containerd-$containerd_version-runc-$runc_version-crictl-$crictl_version/bin
all=(kubelet kubectl containerd containerd-shim-runc-v2 ctr runc crictl)
all_there() {
	local c
	for c in "${all[@]}"; do [[ -x $bin/$c ]] || return 1; done
}
enter_go_cache "$bin" "${all[*]}" "$bin" all_there

# finish NAME TMP START: check that the binary answers --version, then put it in place.
finish() {
	local name=$1 tmp=$2 start=$3
	"$tmp" --version >/dev/null 2>&1 || "$tmp" version --client >/dev/null 2>&1 ||
		{ rm -f "$tmp"; die "$name: built, but '$name --version' fails"; }
	mv "$tmp" "$bin/$name"
	log "$name: built in $((SECONDS - start))s, $(du -h "$bin/$name" | cut -f1)"
}

# Kubernetes' commands, stamped with their version as the control plane is.
kube_minor=${kube_version#v1.}
kube_minor=${kube_minor%%.*}
kube_ldflags="-s -w"
for pkg in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
	kube_ldflags+=" -X $pkg.gitVersion=$kube_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$kube_minor -X $pkg.gitTreeState=clean"
done
for name in kubelet kubectl; do
	[[ -x $bin/$name ]] && continue
	log "$name: building k8s.io/kubernetes/cmd/$name $kube_version with GOTOOLCHAIN=$(go_toolchain "$kube_mod/go.mod") ..."
	start=$SECONDS
	(cd "$kube_mod" && GOTOOLCHAIN=$(go_toolchain go.mod) go build -trimpath -ldflags="$kube_ldflags" -o "$bin/.$name.tmp" "k8s.io/kubernetes/cmd/$name") ||
		{ rm -f "$bin/.$name.tmp"; die "$name: 'go build' in $kube_mod failed (see the errors above)"; }
	finish "$name" "$bin/.$name.tmp" "$start"
done

# The others from their own modules at their tags: `go install pkg@version` builds exactly the
# versions those modules' go.mod files name, checked against the checksum database.
export GOFLAGS=-buildvcs=false
install() { # install NAME PACKAGE@VERSION [GO FLAGS...]
	local name=$1 pkg=$2 start gobin
	shift 2
	[[ -x $bin/$name ]] && return 0
	# Another release's node has the same build of it (same versions, same local Go): copied.
	local other
	for other in "$cache"/node-*-containerd-$containerd_version-runc-$runc_version-crictl-$crictl_version/bin/$name; do
		[[ -x $other && $other != "$bin/$name" ]] || continue
		log "$name: the same build as $other"
		cp "$other" "$bin/.$name.tmp" && finish "$name" "$bin/.$name.tmp" "$SECONDS" && return 0
	done
	log "$name: building $pkg ..."
	start=$SECONDS
	gobin=$(mktemp -d "$bin/.gobin.XXXX")
	GOBIN=$gobin go install -trimpath "$@" "$pkg" || { rm -rf "$gobin"; die "$name: 'go install $pkg' failed (see the errors above)"; }
	mv "$gobin/$name" "$bin/.$name.tmp"
	rm -rf "$gobin"
	finish "$name" "$bin/.$name.tmp" "$start"
}
containerd_ldflags="-s -w -X github.com/containerd/containerd/v2/version.Version=$containerd_version"
for name in containerd containerd-shim-runc-v2 ctr; do
	install "$name" "github.com/containerd/containerd/v2/cmd/$name@$containerd_version" \
		-tags "no_btrfs no_devmapper no_zfs" -ldflags="$containerd_ldflags"
done
install crictl "sigs.k8s.io/cri-tools/cmd/crictl@$crictl_version" \
	-ldflags="-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=$crictl_version"
# runc needs cgo and libseccomp (pkg-config finds it).
command -v pkg-config >/dev/null && pkg-config --exists libseccomp ||
	die "runc: needs pkg-config and libseccomp-dev (apt-get install -y pkg-config libseccomp-dev)"
CGO_ENABLED=1 install runc "github.com/opencontainers/runc@$runc_version" -tags seccomp \
	-ldflags="-s -w -X main.version=${runc_version#v}"
log "node ($kube_version, containerd $containerd_version, runc $runc_version, crictl $crictl_version) in $bin"
echo "$bin"
