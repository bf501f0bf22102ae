#!/usr/bin/env bash
# The reliability and security suite in one command: crash points, the storm, outages,
# security checks (tests/reliability/) and the fuzz targets (tests/fuzz.rs), then one markdown
# table of every figure they print. Fails if any test fails; the tests themselves assert that the
# leaked, double-allocated and stuck counts are 0, and this script checks those cells again.
#
#   bash hack/reliability.sh                 # test profile, 10 s of fuzzing per target
#   MIGDRA_FUZZ_SECONDS=300 bash hack/reliability.sh
#   RELIABILITY_TIMEOUT=600 (default 540) bounds the whole test run.
#
# Needs root for the state-directory outage (it mounts a small tmpfs); without it that row says
# "not run" and the test prints SKIPPED, or fails under MIGDRA_REQUIRE_ROOT=1. The table goes to stdout and to reliability.md in cargo's target directory.
set -euo pipefail
cd "$(dirname "$0")/.."

fuzz_seconds="${MIGDRA_FUZZ_SECONDS:-10}"
limit="${RELIABILITY_TIMEOUT:-540}"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT

# Build first, so the time bound below is the tests' alone.
cargo test --no-run --locked --features crash-points --test reliability --test fuzz --quiet
started=$(date +%s)
status=0
MIGDRA_FUZZ_SECONDS="$fuzz_seconds" MIGDRA_FUZZ_CASES="${MIGDRA_FUZZ_CASES:-256}" \
    timeout --kill-after=10 "$limit" \
    cargo test --locked --features crash-points --test reliability --test fuzz -- --nocapture --test-threads=2 >"$log" 2>&1 || status=$?
took=$(($(date +%s) - started))

if [ "$status" -ne 0 ]; then
    grep -vE '^FIGURE' "$log" | tail -n 80 >&2
    if [ "$status" -eq 124 ] || [ "$status" -eq 137 ]; then
        echo "reliability: timed out after ${limit}s" >&2
    fi
    echo "reliability: FAILED (exit $status)" >&2
fi

table="$(
    printf '| area | figure | value |\n|---|---|---|\n'
    # Sections in a fixed order, rows in the order the tests print them.
    for section in "crash points" "storm" "outage: API server" "outage: kubelet" "outage: node reboot" \
        "outage: state dir" "security" "fuzz"; do
        awk -F '\t' -v s="$section" '$1 == "FIGURE" && $2 == s { printf "| %s | %s | %s |\n", $2, $3, $4 }' "$log"
    done
)"
out_dir="${CARGO_TARGET_DIR:-target}"
mkdir -p "$out_dir"
printf '%s\n\n' "$table" | tee "$out_dir/reliability.md"
echo "($(grep -c '^FIGURE' "$log") figures; tests and fuzzing took ${took}s; fuzzing ${fuzz_seconds}s per target)"
# Each test binary's result line and each skip, for hack/test.sh's count.
grep -E '^(test result:|SKIPPED)' "$log" || true

# The counts that must be zero, wherever a row names them.
bad="$(awk -F '\t' '$1 == "FIGURE" && ($3 ~ /leaked|double|stuck|left state behind|without their instance/) {
    n = split($4, v, " / "); for (i = 1; i <= n; i++) if (v[i] + 0 != 0) print $2 ": " $3 " = " $4 }' "$log")"
if [ -n "$bad" ]; then
    echo "reliability: nonzero counts:" >&2
    echo "$bad" >&2
    exit 1
fi
exit "$status"
