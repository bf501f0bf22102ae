#!/usr/bin/env bash
# Runs every test. README's test command and .ci/run both call this, so they cannot drift.
# --show-output prints what passing tests report, e.g. the counter proof's sets per model.
# Doc tests are skipped (there are none), so the last runner line counts real tests; the script
# ends with one summary line over all test binaries.
set -euo pipefail
cd "$(dirname "$0")/.."
# tests/controlplane.rs runs a real control plane (etcd, kube-apiserver, kube-scheduler,
# kube-controller-manager). Build it from its pinned Go modules when the binaries are missing; the
# build is cached outside the repo and prints the bin directory as its last line.
if [[ -z ${MIGDRA_CONTROLPLANE_BIN:-} ]]; then
  MIGDRA_CONTROLPLANE_BIN=$(bash hack/build-controlplane.sh | tail -n 1)
  export MIGDRA_CONTROLPLANE_BIN
fi
# A 1.34 kube-apiserver too, for the combined-layout run (about 4 more minutes when cold).
if [[ -z ${MIGDRA_CONTROLPLANE_134_BIN:-} ]]; then
  MIGDRA_CONTROLPLANE_134_BIN=$(bash hack/build-controlplane.sh hack/controlplane-1.34 kube-apiserver | tail -n 1)
  export MIGDRA_CONTROLPLANE_134_BIN
fi
# tests/kubelet_code.rs drives migdra with the kubelet's own code (hack/kubelet: its plugin
# manager, DRA manager and the CDI library), and the same program on the kubelet code of 1.34;
# built from pinned Go modules and cached the same way (a few minutes each when cold).
if [[ -z ${MIGDRA_KUBELET_BIN:-} ]]; then
  MIGDRA_KUBELET_BIN=$(bash hack/build-kubelet.sh | tail -n 1)
  export MIGDRA_KUBELET_BIN
fi
if [[ -z ${MIGDRA_KUBELET_134_BIN:-} ]]; then
  MIGDRA_KUBELET_134_BIN=$(bash hack/build-kubelet.sh hack/kubelet-1.34 | tail -n 1)
  export MIGDRA_KUBELET_134_BIN
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
cargo test --locked --workspace --features migdra/crash-points --lib --bins --tests -- --show-output 2>&1 | tee "$log"
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i) ~ /^passed/) p += $(i-1); if ($(i) ~ /^failed/) f += $(i-1) } }
     END { printf "\ntotal: %d passed, %d failed\n", p, f }' "$log"
