#!/usr/bin/env bash
# How many fsyncs one prepare and one unprepare of a dynamic-MIG claim make, by file, as
# docs/performance.md reports them: `migdra claims prepare|unprepare` under strace, on a simulated
# H100 whose state file (gpus.json) stands in for the hardware and is left out of the counts.
#
#   bash hack/count-fsyncs.sh [MIGDRA_BINARY]   # default target/release/migdra
#   BASE=/dev/shm bash hack/count-fsyncs.sh     # the node's files under BASE (default TMPDIR or /tmp)
#
# Needs strace. Prints one line per operation: the total, then the count per fsynced file.
set -euo pipefail
cd "$(dirname "$0")/.."

bin="$(realpath "${1:-${CARGO_TARGET_DIR:-target}/release/migdra}")"
[ -x "$bin" ] || { echo "count-fsyncs: no migdra binary at $bin (cargo build --release)" >&2; exit 1; }
command -v strace >/dev/null || { echo "count-fsyncs: strace is not installed" >&2; exit 1; }
node="$(mktemp -d -p "${BASE:-${TMPDIR:-/tmp}}" migdra-fsyncs-XXXXXX)"
trap 'rm -rf "$node"' EXIT

uid=5f0c3b1e-8a0d-4c9e-9a55-2b7f0e4d6c11
flags=(--sim-state "$node/gpus.json" --state-dir "$node/state" --cdi-dir "$node/cdi"
    --claims-dir "$node/claims" --node-name node-a)
"$bin" layout --sim h100-80gb:1 "${flags[@]}" >/dev/null
minor="$("$bin" layout -o json "${flags[@]}" | sed -n 's/.*"minor": *\([0-9]*\).*/\1/p' | head -n1)"
mkdir -p "$node/claims"
cat >"$node/claims/$uid.json" <<EOF
{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
 "metadata": {"name": "fsyncs", "namespace": "default", "uid": "$uid"},
 "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "mig"}}]}},
 "status": {"allocation": {"devices": {"results": [
   {"request": "gpu", "driver": "mig.slinky.slurm.net", "pool": "node-a", "device": "gpu-$minor-mig-3g40gb-9-4"}]}}}}
EOF
# One warm-up cycle, so the directories exist and neither count includes creating them.
"$bin" claims prepare "$uid" "${flags[@]}" >/dev/null
"$bin" claims unprepare "$uid" "${flags[@]}" >/dev/null

# Every fsynced path of a trace (`fsync(3</path/to/file>) = 0`), without the simulator's state
# file and its directory (the node directory itself).
fsynced() {
    sed -n 's/.*fsync(.*<\(.*\)>) .*/\1/p' "$1" | awk -v n="$node" '$0 != n && $0 !~ /gpus\.json/'
}

for op in prepare unprepare; do
    strace -f -y -qq -e trace=fsync,fdatasync -o "$node/$op.trace" "$bin" claims "$op" "$uid" "${flags[@]}" >/dev/null
    # A temp file is named by what it becomes (.checkpoint.json.tmp-1-2 -> checkpoint.json).
    counts="$(fsynced "$node/$op.trace" |
        sed -e "s#^$node/##" -e 's#/\.\([^/]*\)\.tmp-[0-9-]*$#/\1#' -e 's#/[^/]*-claim_[^/]*\.json$#/<spec>#' |
        sort | uniq -c | awk '{ printf "%s%s %s", sep, $1, $2; sep = ", " }')"
    echo "$op: $(fsynced "$node/$op.trace" | wc -l) fsyncs${counts:+ ($counts)}"
done
