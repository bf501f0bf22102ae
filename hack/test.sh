#!/usr/bin/env bash
# Runs every test. README's test command and .ci/run both call this, so they cannot drift.
# --show-output prints what passing tests report, e.g. the counter proof's sets per model.
# Doc tests are skipped (there are none), so the last runner line counts real tests; the script
# ends with one summary line over all test binaries.
set -euo pipefail
cd "$(dirname "$0")/.."
# The Kubernetes test matrix (1.37.2, 1.36.3, 1.34.4): control planes and kubelet code, built
# once and cached outside the repo; see hack/matrix.sh.
# shellcheck source=hack/matrix.sh
source hack/matrix.sh
log=$(mktemp)
trap 'rm -f "$log"' EXIT
echo "=== every test, control plane $("$MIGDRA_CONTROLPLANE_BIN/kube-apiserver" --version)"
cargo test --locked --workspace --features migdra/crash-points --lib --bins --tests -- --show-output 2>&1 | tee "$log"
for var in MIGDRA_CONTROLPLANE_136_BIN MIGDRA_CONTROLPLANE_134_BIN; do
  [[ ${!var} != "$MIGDRA_CONTROLPLANE_BIN" ]] || continue
  echo "=== tests/controlplane.rs, control plane $("${!var}/kube-apiserver" --version)"
  MIGDRA_CONTROLPLANE_BIN=${!var} cargo test --locked --workspace --features migdra/crash-points \
    --test controlplane -- --show-output 2>&1 | tee -a "$log"
done
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i) ~ /^passed/) p += $(i-1); if ($(i) ~ /^failed/) f += $(i-1) } }
     END { printf "\ntotal: %d passed, %d failed\n", p, f }' "$log"
