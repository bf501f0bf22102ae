#!/usr/bin/env bash
# Read-only check of migdra's NVML backend on a machine with a real NVIDIA GPU: what migdra
# discovers (GPUs, MIG mode, models, existing instances, the driver's procfs) and the
# ResourceSlices it would publish for this node.
#
# It creates and destroys nothing and changes no GPU setting: it runs only `migdra layout`,
# `migdra slices` and `migdra profiles --nvml`, which query NVML (tests/process/nvml.rs checks
# that they call no NVML function that creates, destroys or changes anything), plus nvidia-smi's
# list commands and reads of /proc.
#
#   hack/check-device.sh [OUT_DIR]
#
# Environment: MIGDRA (a migdra binary; default: build target/release/migdra), MIGDRA_NVML_LIB
# (default: libnvidia-ml.so.1 on the loader path), MIGDRA_PROCFS_ROOT (default /proc), NODE_NAME
# (default: the host name). Every output is also saved under OUT_DIR (default: a temporary
# directory, printed at the end). Exits 1 if migdra cannot open NVML or describe a GPU.
set -uo pipefail
cd "$(dirname "$0")/.."

out=${1:-$(mktemp -d -t migdra-check-device.XXXXXX)}
mkdir -p "$out"
node=${NODE_NAME:-$(hostname)}
migdra=${MIGDRA:-}
if [[ -z $migdra ]]; then
    cargo build --release --locked --bin migdra >&2 || exit 1
    migdra=target/release/migdra
fi

failed=0
# run NAME CMD...: print the command and its output, keep both in $out/NAME.
run() {
    local name=$1
    shift
    printf '\n=== %s\n' "$*"
    local rc=0
    "$@" >"$out/$name" 2>"$out/$name.err" || rc=$?
    cat "$out/$name"
    if ((rc != 0)); then
        cat "$out/$name.err"
        echo "(exit $rc)"
        return 1
    fi
}

# What the driver says, for comparison (list commands only).
if command -v nvidia-smi >/dev/null; then
    run nvidia-smi-L nvidia-smi -L
    run nvidia-smi-mig nvidia-smi --query-gpu=index,minor_number,uuid,pci.bus_id,name,mig.mode.current,mig.mode.pending,driver_version --format=csv
    run nvidia-smi-lgip nvidia-smi mig -lgip
    run nvidia-smi-lgipp nvidia-smi mig -lgipp
    run nvidia-smi-lgi nvidia-smi mig -lgi
fi
# What migdra discovers and would publish.
run layout "$migdra" layout || failed=1
run layout.json "$migdra" layout -o json || failed=1
run slices "$migdra" slices --node-name "$node" || failed=1
run slices.yaml "$migdra" slices --node-name "$node" -o yaml || failed=1
run slices-static "$migdra" --mig-mode static slices --node-name "$node" || failed=1
# NVML's own profile answers (whatever the MIG mode) beside the catalog's figures.
run profiles-nvml "$migdra" profiles --nvml || failed=1
run profiles-nvml.json "$migdra" profiles --nvml -o json || failed=1

# The driver's procfs, where the CDI specs' capability nodes come from.
procfs=${MIGDRA_PROCFS_ROOT:-/proc}
run proc-devices grep -E 'nvidia' "$procfs/devices"
run proc-caps find "$procfs/driver/nvidia/capabilities" -maxdepth 4 -name access

printf '\nsaved in %s\n' "$out"
exit $failed
