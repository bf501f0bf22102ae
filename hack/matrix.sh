# Sourced by hack/test.sh and .ci/run: exports the bin directories of the Kubernetes test matrix,
# building what is missing. Variables already set are kept, so a caller can name its own builds.
#
# The Kubernetes releases the tests run against: 1.37.2 (the newest), 1.36.3 and 1.34.4. Each
# control plane (etcd, kube-apiserver, kube-scheduler, kube-controller-manager) is built from its
# pinned Go modules when missing (hack/controlplane-1.37, hack/controlplane, hack/controlplane-1.34;
# 8-10 minutes each when cold) and cached outside the repo; the build prints its bin directory
# as its last line.
# built VAR SCRIPT MODULE: export VAR as the bin directory SCRIPT builds from MODULE, unless set.
built() {
  [[ -z ${!1:-} ]] || return 0
  local dir
  dir=$(bash "$2" "$3" | tail -n 1)
  export "$1=$dir"
}
built MIGDRA_CONTROLPLANE_137_BIN hack/build-controlplane.sh hack/controlplane-1.37
built MIGDRA_CONTROLPLANE_136_BIN hack/build-controlplane.sh hack/controlplane
built MIGDRA_CONTROLPLANE_134_BIN hack/build-controlplane.sh hack/controlplane-1.34
# The whole suite runs against the newest; tests/controlplane.rs runs again on the others below.
export MIGDRA_CONTROLPLANE_BIN=${MIGDRA_CONTROLPLANE_BIN:-$MIGDRA_CONTROLPLANE_137_BIN}
# tests/kubelet_code.rs drives migdra with the kubelet's own code (hack/kubelet: its plugin
# manager, DRA manager and the CDI library) of 1.37, 1.36 and 1.34, each against the control plane
# of its own release; built from pinned Go modules and cached the same way (a few minutes each when
# cold).
built MIGDRA_KUBELET_137_BIN hack/build-kubelet.sh hack/kubelet-1.37
built MIGDRA_KUBELET_BIN hack/build-kubelet.sh hack/kubelet
built MIGDRA_KUBELET_134_BIN hack/build-kubelet.sh hack/kubelet-1.34
echo "control planes of the matrix:"
for var in MIGDRA_CONTROLPLANE_137_BIN MIGDRA_CONTROLPLANE_136_BIN MIGDRA_CONTROLPLANE_134_BIN; do
  printf '  %s: %s (%s)\n' "$var" "$("${!var}/kube-apiserver" --version)" "${!var}"
done
echo "kubelet code:"
for var in MIGDRA_KUBELET_137_BIN MIGDRA_KUBELET_BIN MIGDRA_KUBELET_134_BIN; do
  printf '  %s: %s\n' "$var" "${!var}"
done
