#!/usr/bin/env bash
# Builds the real slurm-bridge: its `scheduler` (a whole kube-scheduler with the out-of-tree plugin
# SlurmBridge), `controllers` and `admission`, from the source archives in the workplace's
# shared/peers/ (the Go module proxy refuses the bridge and its pinned slurm-client). Nothing of
# their code is in this repo: the archives are unpacked into the cache, the bridge's go.mod gets one
# `replace` of slurm-client by the archive of the exact commit it pins, and every other module comes
# from the proxy.
#
# The bridge is built on the Kubernetes of the project's 1.36 control plane
# (hack/controlplane-1.36/go.mod: v1.36.3, where the bridge pins v1.36.0; a patch release apart):
# its go.mod gets that module's requires and replaces, so both select the same version of every
# module they share and the bridge's scheduler reuses the packages the control plane's
# kube-scheduler compiled (built first, here, when missing). The bridge's own code is unchanged.
#
# The binaries go to a cache outside the repo, keyed by the bridge's commit and that go.mod:
#   ${MIGDRA_CACHE:-$HOME/.cache/migdra}/slurm-bridge-<commit>-k8s-<go.mod hash>/bin/
# When all three are there the build is skipped. The last line printed is that bin directory;
# everything else goes to stderr, so `bin=$(hack/build-bridge.sh | tail -n 1)` works.
#
# Alone and cold, the scheduler is about 15 minutes of 2 cores; after the control plane's
# kube-scheduler it compiles the bridge's own packages and its few libraries the control plane lacks.
#
# With --patched it builds the bridge with migdra's patch series applied
# (hack/slurm-bridge/patches/*.patch, in name order, with `git apply`: the change the bridge needs
# for the loop of docs/bridge-contract.md, written as an upstream pull request,
# hack/slurm-bridge/PULL_REQUEST.md), cached apart by the series' hash:
#   .../slurm-bridge-<commit>-k8s-<go.mod hash>+migdra-<hash>/bin/
# The unchanged and the patched bridge share the Go build cache, so the second one costs little
# more than the packages the series changes.
#
# --patched --unit-tests runs the bridge's own unit tests of every package the series touches
# instead of building, once per series: a pass leaves unit-tests-passed beside bin/, and a run that
# finds it says so and runs nothing. They are a step of their own so that CI can run them after the
# binaries its tests wait for (they cost more than the patched build itself). The bridge's
# controller suites start an API server (controller-runtime's envtest): they get etcd and
# kube-apiserver from the project's 1.37 control plane (hack/build-controlplane.sh, cached; it waits
# while another process builds it), or from KUBEBUILDER_ASSETS when set.
#
# Usage: hack/build-bridge.sh [--patched [--unit-tests]] [--bin-dir] [--peers]
#   --bin-dir: print the bin directory and exit, building nothing (.ci/run names it before the
#   build it starts in the background is done).
#   --peers: print the bridge's archive and exit, or fail when the archives are not found.
#
# Environment: MIGDRA_PEERS, the folder holding slurm-bridge-<commit>.tar.gz and
# slurm-client-<commit>.tar.gz (default: the first of ../shared/peers beside this repo and
# /work/shared/peers that exists); MIGDRA_CACHE; GOTOOLCHAIN (default local).
set -euo pipefail

hack=$(cd "$(dirname "$0")" && pwd)
me=build-bridge
# shellcheck source=hack/lib.sh
source "$hack/lib.sh"

# The commits, one place each: the bridge's newest public commit and the slurm-client its go.mod pins.
bridge_commit=6f700ba
client_commit=463c164
client_module=github.com/SlinkyProject/slurm-client

command -v go >/dev/null || die "go is not on PATH; the bridge is built from Go (needs Go >= 1.26)"

# find_peers: set bridge_tar and client_tar from MIGDRA_PEERS, else the first of
# ../shared/peers beside this repo and /work/shared/peers that exists; die when either is missing.
find_peers() {
	local peers=${MIGDRA_PEERS:-} p f
	if [[ -z $peers ]]; then
		for p in "$hack/../../shared/peers" /work/shared/peers; do
			[[ -d $p ]] && { peers=$(cd "$p" && pwd); break; }
		done
	fi
	bridge_tar=$peers/slurm-bridge-$bridge_commit.tar.gz
	client_tar=$peers/slurm-client-$client_commit.tar.gz
	for f in "$bridge_tar" "$client_tar"; do
		[[ -f $f ]] || die "no $(basename "$f") in '${peers:-<none found>}' (set MIGDRA_PEERS to the folder of the peers' source archives)"
	done
}

patched=false
print_bin=false
unit_tests=false
for arg in "$@"; do
	case $arg in
		--patched) patched=true ;;
		--unit-tests) unit_tests=true ;;
		--bin-dir) print_bin=true ;;
		--peers) find_peers; echo "$bridge_tar"; exit 0 ;;
		*) die "unknown argument '$arg' (usage: $0 [--patched [--unit-tests]] [--bin-dir] [--peers])" ;;
	esac
done
$patched || ! $unit_tests || die "--unit-tests is for the patch series: use --patched --unit-tests"
patches=()
# The control plane whose Kubernetes and library versions the bridge is built with (see above).
kube_mod=$hack/controlplane-1.36
variant=slurm-bridge-$bridge_commit-k8s-$(sha256sum <"$kube_mod/go.mod" | cut -c1-8)
if $patched; then
	patches=("$hack"/slurm-bridge/patches/*.patch)
	[[ -f ${patches[0]} ]] || die "no patches in $hack/slurm-bridge/patches"
	variant+=+migdra-$(cat "${patches[@]}" | sha256sum | cut -c1-12)
fi
cache=${MIGDRA_CACHE:-$HOME/.cache/migdra}
root=$cache/$variant
bin=$root/bin
if $print_bin; then
	echo "$bin"
	exit 0
fi
all=(scheduler controllers admission)
all_there() {
	local c
	for c in "${all[@]}"; do [[ -x $bin/$c ]] || return 1; done
}
passed=$root/unit-tests-passed
tests_passed() { [[ -f $passed ]]; }
# Both steps unpack into the same place: they take the same lock (bin/.lock).
if $unit_tests; then
	enter_go_cache "$bin" "the bridge's unit tests with the patch series: passed once" "$passed" tests_passed
else
	enter_go_cache "$bin" "slurm-bridge ${all[*]}" "$bin" all_there
fi
find_peers
# The bridge's go.sum has no line for the replaced slurm-client, so its own build lets the go
# command complete go.sum (in the cache's copy, never in the archive).
export GOFLAGS="-mod=mod -buildvcs=false"

unpacked=$root/src
rm -rf "$unpacked"
mkdir -p "$unpacked"
tar -xzf "$bridge_tar" -C "$unpacked"
tar -xzf "$client_tar" -C "$unpacked"
[[ -f $unpacked/slurm-bridge/go.mod && -f $unpacked/slurm-client/go.mod ]] ||
	die "the archives do not unpack to slurm-bridge/ and slurm-client/ (in $unpacked)"
(cd "$unpacked/slurm-bridge" && go mod edit -replace "$client_module=../slurm-client")
# The control plane's requires and replaces (its Kubernetes, its library versions) onto the bridge's
# go.mod; versions the bridge's other modules need higher stay higher (Go's minimal version selection).
mapfile -t pins < <(cd "$kube_mod" && go mod edit -json | awk '
	/"Require": \[/ { mode = "require" } /"Replace": \[/ { mode = "replace" }
	/"Old": \{/ { side = "old" } /"New": \{/ { side = "new" }
	/"Path":/ { gsub(/[",]/, "", $2); if (mode == "replace" && side == "old") old = $2; else path = $2 }
	/"Version":/ { gsub(/[",]/, "", $2)
		if (mode == "require") print "-require=" path "@" $2
		else if (mode == "replace" && side == "new") print "-replace=" old "=" path "@" $2 }')
[[ ${#pins[@]} -gt 100 ]] || die "read only ${#pins[@]} pins from $kube_mod/go.mod"
(cd "$unpacked/slurm-bridge" && go mod edit "${pins[@]}")
# Modules whose packages both schedulers compile, at different versions: each would cost a second
# compile of everything that imports it (about 15 minutes of a cold CI run), so the build stops and
# says which to raise in the control plane's go.mod (as its comment says how).
modules() { go list -deps -f '{{with .Module}}{{.Path}} {{.Version}}{{end}}' "$1" | awk 'NF == 2' | sort -u; }
differ=$(join <(cd "$kube_mod" && GOFLAGS=-mod=readonly modules k8s.io/kubernetes/cmd/kube-scheduler) \
	<(cd "$unpacked/slurm-bridge" && modules ./cmd/scheduler) | awk '$2 != $3 { print $1 }' | xargs)
[[ -z $differ ]] || die "the bridge needs newer versions than ${kube_mod#"$hack/"}/go.mod of: $differ (raise them there with go mod edit -require and go mod tidy)"
log "every module both schedulers compile is at ${kube_mod#"$hack/"}'s version"
if [[ ${#patches[@]} -gt 0 ]]; then
	packages=()
	for p in "${patches[@]}"; do
		(cd "$unpacked/slurm-bridge" && git apply --whitespace=nowarn "$p") ||
			die "$(basename "$p") does not apply to slurm-bridge $bridge_commit"
		log "applied $(basename "$p")"
		while read -r dir; do packages+=("./$dir"); done < <(awk '/^\+\+\+ b\/.*\.go$/ { sub(/^\+\+\+ b\//, ""); sub(/\/[^\/]*$/, ""); print }' "$p")
	done
	mapfile -t packages < <(printf '%s\n' "${packages[@]}" | sort -u)
fi
if $unit_tests; then
	if [[ -z ${KUBEBUILDER_ASSETS:-} ]]; then
		KUBEBUILDER_ASSETS=$(env -u GOFLAGS bash "$hack/build-controlplane.sh" "$hack/controlplane-1.37" etcd kube-apiserver | tail -n 1) ||
			die "the bridge's envtest suites need etcd and kube-apiserver: hack/build-controlplane.sh failed"
	fi
	export KUBEBUILDER_ASSETS
	start=$SECONDS
	log "the bridge's own unit tests of ${packages[*]} (envtest: $KUBEBUILDER_ASSETS) ..."
	(cd "$unpacked/slurm-bridge" && go test -count=1 "${packages[@]}") >&2 ||
		die "the bridge's unit tests fail with the patch series (see above)"
	log "unit tests passed in $((SECONDS - start))s"
	touch "$passed"
	echo "$passed"
	exit 0
fi
kube_version=$(awk '$1 == "k8s.io/kubernetes" { print $2; exit }' "$unpacked/slurm-bridge/go.mod")
log "$variant ($(cat "$unpacked/slurm-bridge/VERSION" 2>/dev/null || echo '?'), k8s.io/kubernetes $kube_version)"

# The control plane's kube-scheduler first: the bridge's scheduler reuses what it compiles.
env -u GOFLAGS bash "$hack/build-controlplane.sh" "$kube_mod" kube-scheduler >/dev/null ||
	die "hack/build-controlplane.sh ${kube_mod#"$hack/"} kube-scheduler failed"
total=$SECONDS
for c in "${all[@]}"; do
	[[ -x $bin/$c ]] && { log "$c: already built"; continue; }
	start=$SECONDS
	log "$c: building ./cmd/$c ..."
	(cd "$unpacked/slurm-bridge" && go build -trimpath -ldflags="-s -w" -o "$bin/.$c.tmp" "./cmd/$c") ||
		{ rm -f "$bin/.$c.tmp"; die "$c: 'go build ./cmd/$c' failed (see the errors above)"; }
	mv "$bin/.$c.tmp" "$bin/$c"
	log "$c: built in $((SECONDS - start))s, $(du -h "$bin/$c" | cut -f1)"
done
log "$variant: ${all[*]} ready in $((SECONDS - total))s"
echo "$bin"
