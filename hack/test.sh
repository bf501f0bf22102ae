#!/usr/bin/env bash
# Runs every test. README's test command and .ci/run both call this, so they cannot drift.
# --show-output prints what passing tests report, e.g. the counter proof's sets per model.
# Doc tests are skipped (there are none), so the last runner line counts real tests; the script
# ends with one summary line over all test binaries.
set -euo pipefail
cd "$(dirname "$0")/.."
# The packages the tests need that the machine lacks (a fresh machine needs nothing else).
bash hack/setup.sh
# The Kubernetes test matrix (1.37.2, 1.36.3, the pre-release 1.38.0-beta.0): control planes,
# kubelet code and real nodes, built once and cached outside the repo; see hack/matrix.sh.
# shellcheck source=hack/matrix.sh
source hack/matrix.sh
# The Go-built tools the chart, manifest and alert tests run: kustomize, helm and promtool, each
# built from its pinned module and cached like the matrix (a few minutes each when cold; without
# them those tests would only say SKIPPED).
for tool in kustomize helm promtool; do
  bash "hack/build-$tool.sh" >/dev/null
done
# tests/node/ runs migdra's image on a real node: the one .ci/run built, else build it here.
if [[ -z ${MIGDRA_IMAGE_ARCHIVE:-} ]]; then
  MIGDRA_IMAGE_ARCHIVE=$(bash hack/build-image.sh | tail -n 1)
  export MIGDRA_IMAGE_ARCHIVE
fi
# Slurm 26.05 for the whole suite unless MIGDRA_SLURM_BIN is set (empty: Debian 12's 22.05).
export MIGDRA_SLURM_BIN=${MIGDRA_SLURM_BIN-$MIGDRA_SLURM_2605_BIN}
log=$(mktemp)
trap 'rm -f "$log"' EXIT
echo "=== every test, control plane $("$MIGDRA_CONTROLPLANE_BIN/kube-apiserver" --version), Slurm $("${MIGDRA_SLURM_BIN:-/usr/sbin}/slurmd" -V)"
# Every test target but the reliability suite and the fuzz targets: hack/reliability.sh runs those
# once, below, bounded in time and with its table of figures.
targets=()
for file in tests/*.rs tests/*/main.rs; do
  name=$(basename "${file%/main.rs}" .rs)
  [[ $name == fuzz || $name == reliability ]] || targets+=(--test "$name")
done
# One after another: the real node and Slurm tests wait on real time, and a test binary running
# beside them starves their kubelet, containerd and API server (tried: a prepare ran past the
# kubelet's timeout). --no-fail-fast: one run shows every failing binary.
cargo_test=(cargo test --locked --workspace --features migdra/crash-points)
# The tests of the other releases run after this suite: 1.36's and 1.38's builds may still be
# running in the background (.ci/run). This one runs 1.36's API server with a gate off, whatever
# the release: it runs with 1.36.
on_136_only=a_server_that_drops_device_taints_is_not_rewritten_in_a_loop
"${cargo_test[@]}" --no-fail-fast --lib --bins "${targets[@]}" -- --show-output \
  --skip kubelet_136_ --skip kubelet_138_ --skip "$on_136_only" 2>&1 | tee "$log"
# await_release MINOR: once the background build of 1.MINOR (hack/build-release.sh) has written the
# `exit` line of its log, export the variables it printed. Without a log, hack/matrix.sh built it.
await_release() {
  local var=MIGDRA_RELEASE_$1_LOG
  [[ -n ${!var:-} ]] || return 0
  echo "=== waiting for the 1.${1#1} builds (hack/build-release.sh, in the background)"
  until [[ $(tail -n 1 "${!var}") == exit* ]]; do sleep 5; done
  if [[ $(tail -n 1 "${!var}") != "exit 0" ]]; then
    grep -v '^go: downloading' "${!var}" >&2
    echo "hack/build-release.sh 1.${1#1} failed: that release was not tested" >&2
    exit 1
  fi
  eval "$(grep '^export MIGDRA_' "${!var}")"
}
# Then the tests whose outcome depends on what the API server, the scheduler and the kubelet do,
# on each other release. Five are the same on every release and do not run again: they test
# migdra's own recovery (a crash, a refused watch, an absent server, a rollback, a held device)
# through plain list, watch and write calls (about 80 s a release).
same_on_every_release=(
  a_claim_left_mid_prepare_whose_pod_is_deleted_is_rolled_back
  a_held_device_stays_published_whatever_the_allowlist
  a_refused_watch_lists_again_after_a_backoff_not_in_a_loop
  serve_killed_after_an_api_write_converges_when_started_again
  serve_waits_for_an_api_server_that_is_not_there_yet
)
# One release after another, as the suite above: run side by side (tried in CI), their API
# servers stopped answering in time under the background builds' load.
await_release 136
echo "=== tests/controlplane.rs, $("$MIGDRA_CONTROLPLANE_136_BIN/kube-apiserver" --version), but the same five; its kubelet code"
with_136=(env "MIGDRA_CONTROLPLANE_BIN=$MIGDRA_CONTROLPLANE_136_BIN")
"${with_136[@]}" "${cargo_test[@]}" --test controlplane -- --show-output "${same_on_every_release[@]/#/--skip=}" 2>&1 |
  tee -a "$log"
"${with_136[@]}" "${cargo_test[@]}" --test kubelet_code -- --show-output kubelet_136_ 2>&1 | tee -a "$log"
# The pre-release (1.38.0-beta.0): the same control-plane tests, its kubelet code, the Slurm loop
# (Slurm 26.05) and the chart on a real node whose kubelet is 1.38's, joined to 1.38's control plane.
await_release 138
pre=(env "MIGDRA_CONTROLPLANE_BIN=$MIGDRA_CONTROLPLANE_138_BIN" "MIGDRA_NODE_BIN=$MIGDRA_NODE_138_BIN")
echo "=== tests/controlplane.rs, $("$MIGDRA_CONTROLPLANE_138_BIN/kube-apiserver" --version), but the same six;" \
  "its kubelet code; the Slurm loop; the chart on a real node, $("$MIGDRA_NODE_138_BIN/kubelet" --version)"
"${pre[@]}" "${cargo_test[@]}" --test controlplane -- --show-output "${same_on_every_release[@]/#/--skip=}" \
  --skip "$on_136_only" 2>&1 | tee -a "$log"
"${pre[@]}" "${cargo_test[@]}" --test kubelet_code -- --show-output kubelet_138_ 2>&1 | tee -a "$log"
"${pre[@]}" "${cargo_test[@]}" --test slurm_loop -- --show-output 2>&1 | tee -a "$log"
"${pre[@]}" "${cargo_test[@]}" --test node -- --show-output --exact the_chart_on_a_real_node 2>&1 | tee -a "$log"
if [[ -n $MIGDRA_SLURM_BIN ]]; then
  echo "=== tests/slurm.rs and tests/slurm_loop.rs, Slurm $(/usr/sbin/slurmd -V) (Debian 12)"
  MIGDRA_SLURM_BIN='' "${cargo_test[@]}" --test slurm --test slurm_loop -- --show-output 2>&1 | tee -a "$log"
fi
echo "=== the reliability suite and the fuzz targets (hack/reliability.sh)"
bash hack/reliability.sh 2>&1 | tee -a "$log"
# A test that cannot run here prints one SKIPPED line (tests/support/skip.rs) and passes; it is
# counted as skipped, not passed, and listed. .ci/run sets every MIGDRA_REQUIRE_*, so there a
# skip fails instead.
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i) ~ /^passed/) p += $(i-1); if ($(i) ~ /^failed/) f += $(i-1) } }
     /^SKIPPED/ { s++; skipped = skipped "\n  " $0 }
     END { if (s) printf "\nskipped:%s", skipped; printf "\ntotal: %d passed, %d skipped, %d failed\n", p - s, s, f }' "$log"
