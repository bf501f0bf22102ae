#!/usr/bin/env bash
# Runs every test. README's test command and .ci/run both call this, so they cannot drift.
# --show-output prints what passing tests report, e.g. the counter proof's sets per model.
# Doc tests are skipped (there are none), so the last runner line counts real tests; the script
# ends with one summary line over all test binaries.
set -euo pipefail
cd "$(dirname "$0")/.."
# The Kubernetes test matrix (1.37.2, 1.36.3): control planes and kubelet code, built
# once and cached outside the repo; see hack/matrix.sh.
# shellcheck source=hack/matrix.sh
source hack/matrix.sh
# tests/node.rs runs migdra's image on a real node: the one .ci/run built, else build it here.
if [[ -z ${MIGDRA_IMAGE_ARCHIVE:-} ]]; then
  MIGDRA_IMAGE_ARCHIVE=$(bash hack/build-image.sh | tail -n 1)
  export MIGDRA_IMAGE_ARCHIVE
fi
# Slurm 26.05 for the whole suite unless MIGDRA_SLURM_BIN is set (empty: Debian 12's 22.05).
export MIGDRA_SLURM_BIN=${MIGDRA_SLURM_BIN-$MIGDRA_SLURM_2605_BIN}
log=$(mktemp)
node_log=$(mktemp)
trap 'rm -f "$log" "$node_log"' EXIT
echo "=== every test, control plane $("$MIGDRA_CONTROLPLANE_BIN/kube-apiserver" --version), Slurm $("${MIGDRA_SLURM_BIN:-/usr/sbin}/slurmd" -V)"
cargo_test() { cargo test --locked --workspace --features migdra/crash-points "$@"; }
# Every test target, built once here (hack/reliability.sh then finds its two built); cargo holds
# its build lock only while it builds, so the two lanes below then run side by side.
targets=()
for file in tests/*.rs; do
  name=$(basename "$file" .rs)
  targets+=(--test "$name")
done
started=$SECONDS
cargo_test --lib --bins "${targets[@]}" --no-run 2>&1 | tee "$log"
echo "=== built every test target in $((SECONDS - started))s"
# Two lanes, because on 2 cores the real node and Slurm mostly wait on real time (a kubelet
# starting containers, slurmctld's periods) while the rest mostly computes:
#   node lane: tests/node.rs (real node, slurm-bridge), tests/slurm.rs and tests/slurm_loop.rs on
#     Slurm 26.05, then again on Debian 12's 22.05; every test that runs Slurm is in this lane,
#     one binary at a time, so no two Slurm clusters share munge and the spool directories;
#   this lane: the unit tests, tests/apiserver.rs, kubelet_code.rs, library.rs, process.rs,
#     then the reliability suite.
# tests/controlplane.rs runs after both, alone, on each control plane: its race tests count
# what the scheduler did under their own load only.
# The node lane's output is printed whole when it ends, so neither lane's lines interleave.
node_lane() {
  local started=$SECONDS
  cargo_test --test node --test slurm --test slurm_loop -- --show-output
  if [[ -n $MIGDRA_SLURM_BIN ]]; then
    echo "=== tests/slurm.rs and tests/slurm_loop.rs, Slurm $(/usr/sbin/slurmd -V) (Debian 12)"
    MIGDRA_SLURM_BIN='' cargo_test --test slurm --test slurm_loop -- --show-output
  fi
  echo "=== the node lane took $((SECONDS - started))s"
}
node_lane >"$node_log" 2>&1 &
node_pid=$!
started=$SECONDS
status=0
lane=()
for file in tests/*.rs; do
  name=$(basename "$file" .rs)
  case $name in fuzz | reliability | node | slurm | slurm_loop | controlplane) ;; *) lane+=(--test "$name") ;; esac
done
cargo_test --lib --bins "${lane[@]}" -- --show-output 2>&1 | tee -a "$log" || status=1
echo "=== the reliability suite and the fuzz targets (hack/reliability.sh)"
bash hack/reliability.sh 2>&1 | tee -a "$log" || status=1
echo "=== this lane took $((SECONDS - started))s; waiting for the node lane"
wait "$node_pid" || status=1
echo "=== the node lane: tests/node.rs, tests/slurm.rs, tests/slurm_loop.rs"
tee -a "$log" <"$node_log"
for var in MIGDRA_CONTROLPLANE_BIN MIGDRA_CONTROLPLANE_136_BIN; do
  [[ $var == MIGDRA_CONTROLPLANE_BIN || ${!var} != "$MIGDRA_CONTROLPLANE_BIN" ]] || continue
  echo "=== tests/controlplane.rs, control plane $("${!var}/kube-apiserver" --version)"
  MIGDRA_CONTROLPLANE_BIN=${!var} cargo_test --test controlplane -- --show-output 2>&1 | tee -a "$log" || status=1
done
# A test that cannot run here prints one SKIPPED line (tests/support/skip.rs) and passes; it is
# counted as skipped, not passed, and listed. .ci/run sets every MIGDRA_REQUIRE_*, so there a
# skip fails instead.
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i) ~ /^passed/) p += $(i-1); if ($(i) ~ /^failed/) f += $(i-1) } }
     /^SKIPPED/ { s++; skipped = skipped "\n  " $0 }
     END { if (s) printf "\nskipped:%s", skipped; printf "\ntotal: %d passed, %d skipped, %d failed\n", p - s, s, f }' "$log"
exit "$status"
