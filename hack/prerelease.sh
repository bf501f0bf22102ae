#!/usr/bin/env bash
# Builds the Kubernetes pre-release of the test matrix, 1.38.0-beta.0 (1.38.0 is one pin away in
# each module): its control plane (hack/controlplane-1.38), the kubelet's code
# (hack/kubelet-1.38) and a real node with its kubelet binary (hack/build-node.sh
# hack/controlplane-1.38). Each is cached outside the repo like the rest of the matrix; cold, the
# three take about 8 minutes, with Go 1.27 (the modules' toolchain line; the go command fetches it).
#
# Prints one `export VAR=DIR` line per build, the variables hack/test.sh runs 1.38 with; the rest
# goes to stderr. hack/matrix.sh evaluates them; .ci/run runs this in the background and hack/test.sh
# reads its log (MIGDRA_PRERELEASE_LOG).
set -euo pipefail
cd "$(dirname "$0")/.."
for build in \
  "MIGDRA_CONTROLPLANE_138_BIN hack/build-controlplane.sh hack/controlplane-1.38" \
  "MIGDRA_KUBELET_138_BIN hack/build-kubelet.sh hack/kubelet-1.38" \
  "MIGDRA_NODE_138_BIN hack/build-node.sh hack/controlplane-1.38"; do
  read -r var script module <<<"$build"
  dir=$(bash "$script" "$module" | tail -n 1)
  [[ -d $dir ]] || { echo "prerelease: $script $module printed no bin directory" >&2; exit 1; }
  echo "export $var=$dir"
done
