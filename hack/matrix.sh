# Sourced by hack/test.sh and .ci/run: exports the bin directories of the Kubernetes test matrix,
# building what is missing. Variables already set are kept, so a caller can name its own builds.
#
# The Kubernetes releases the tests run against: 1.37.2 (the newest: the whole suite), then 1.36.3
# and the pre-release 1.38.0-beta.0 (hack/build-release.sh, below). Each control plane (etcd,
# kube-apiserver, kube-scheduler, kube-controller-manager) is built from its pinned Go modules when
# missing (hack/controlplane-<release>; 5-8 minutes each when cold) and cached outside the repo; the
# build prints its bin directory as its last line.
# 1.34 (past its end of life) left the matrix after ad9ee16, the last commit that passed on 1.34:
# its build and tests cost ~9 minutes of a cold CI run that had to stay under 60.
# built VAR SCRIPT [MODULE]: export VAR as the bin directory SCRIPT builds (from MODULE), unless set.
built() {
  [[ -z ${!1:-} ]] || return 0
  local dir
  dir=$(bash "$2" "${@:3}" | tail -n 1)
  export "$1=$dir"
}
built MIGDRA_CONTROLPLANE_137_BIN hack/build-controlplane.sh hack/controlplane-1.37
# The whole suite runs against the newest; tests/controlplane.rs runs again on the others below.
export MIGDRA_CONTROLPLANE_BIN=${MIGDRA_CONTROLPLANE_BIN:-$MIGDRA_CONTROLPLANE_137_BIN}
# tests/kubelet_code.rs drives migdra with the kubelet's own code (hack/kubelet-<release>: its
# plugin manager, DRA manager and the CDI library) of each release, against the control plane of its
# own release; built from pinned Go modules and cached the same way (a few minutes each when cold).
built MIGDRA_KUBELET_137_BIN hack/build-kubelet.sh hack/kubelet-1.37
# tests/node/ runs a real node: the kubelet binary and kubectl (1.37, from the control plane's
# module set), containerd, runc and crictl; built and cached the same way (about 12 minutes cold).
built MIGDRA_NODE_BIN hack/build-node.sh
# The releases hack/test.sh runs after the main suite, 1.36.3 (its control plane and kubelet code)
# and the pre-release 1.38.0-beta.0 (those and a node): hack/build-release.sh. .ci/run builds them
# in the background and names the logs, ending with their variables, that hack/test.sh waits for.
if [[ -z ${MIGDRA_RELEASE_136_LOG:-} && -z ${MIGDRA_KUBELET_136_BIN:-} ]]; then
  eval "$(bash hack/build-release.sh 1.36)"
fi
if [[ -z ${MIGDRA_RELEASE_138_LOG:-} && -z ${MIGDRA_NODE_138_BIN:-} ]]; then
  eval "$(bash hack/build-release.sh 1.38 --node)"
fi
# Slurm: Debian 12's 22.05 is installed by hack/slurm-deps.sh; 26.05, the release slurm-bridge
# users run, comes from Debian unstable in a chroot (hack/slurm-2605.sh, cached, about 1.5 minutes
# cold). The suite runs on 26.05; hack/test.sh runs the Slurm tests again on 22.05.
built MIGDRA_SLURM_2605_BIN hack/slurm-2605.sh
# The real slurm-bridge (tests/node/bridge.rs): its scheduler, controllers and admission from the
# peers' source archives (hack/build-bridge.sh, cached by commit; on the 1.36 control plane's
# Kubernetes, whose compiled packages it reuses: a minute or two after that control plane).
# .ci/run builds it in the background and names it before this runs.
# Without the archives (a machine outside this workplace) the bridge's tests skip, saying so;
# .ci/run requires them (MIGDRA_REQUIRE_BRIDGE=1).
if [[ -n ${MIGDRA_BRIDGE_BIN:-} ]] || bash hack/build-bridge.sh --peers >/dev/null 2>&1; then
  built MIGDRA_BRIDGE_BIN hack/build-bridge.sh
  # ... and with migdra's patch series (hack/slurm-bridge/patches), then the bridge's own unit
  # tests of what the series touches (once per series). A caller that names the patched build
  # runs those tests itself (.ci/run: in the background, after the builds).
  if [[ -z ${MIGDRA_BRIDGE_PATCHED_BIN:-} ]]; then
    built MIGDRA_BRIDGE_PATCHED_BIN hack/build-bridge.sh --patched
    bash hack/build-bridge.sh --patched --unit-tests >/dev/null
  fi
fi
echo "control planes of the matrix and the kubelet code of their releases:"
for minor in 137 136 138; do
  cp=MIGDRA_CONTROLPLANE_${minor}_BIN kubelet=MIGDRA_KUBELET_${minor}_BIN log=MIGDRA_RELEASE_${minor}_LOG
  if [[ -n ${!kubelet:-} ]]; then
    printf '  %s: %s (%s), kubelet code %s\n' "$cp" "$("${!cp}/kube-apiserver" --version)" "${!cp}" "${!kubelet}"
  else
    printf '  1.%s: building in the background (hack/build-release.sh, log %s)\n' "${minor#1}" "${!log:-}"
  fi
done
[[ -z ${MIGDRA_NODE_138_BIN:-} ]] || echo "  the 1.38 node (tests/node/ on 1.38): $MIGDRA_NODE_138_BIN"
echo "real node (tests/node/): $MIGDRA_NODE_BIN"
printf '  %s\n' "$("$MIGDRA_NODE_BIN/kubelet" --version)" "containerd $("$MIGDRA_NODE_BIN/containerd" --version | awk '{print $3}')" \
  "$("$MIGDRA_NODE_BIN/runc" --version | head -n 1)" "$("$MIGDRA_NODE_BIN/crictl" --version)" \
  "kubectl $("$MIGDRA_NODE_BIN/kubectl" version --client -o json | awk -F'"' '/gitVersion/ {print $4; exit}')"
echo "Slurm: $(/usr/sbin/slurmd -V 2>/dev/null || echo "22.05 missing (hack/slurm-deps.sh)") (Debian 12), $("$MIGDRA_SLURM_2605_BIN/slurmd" -V) ($MIGDRA_SLURM_2605_BIN)"
echo "slurm-bridge: ${MIGDRA_BRIDGE_BIN:-no source archives, its tests skip}, patched: ${MIGDRA_BRIDGE_PATCHED_BIN:-none}"
