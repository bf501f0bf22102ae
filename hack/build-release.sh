#!/usr/bin/env bash
# Builds one Kubernetes release of the test matrix that hack/test.sh runs after the main suite:
# its control plane (hack/controlplane-<release>), the kubelet's code (hack/kubelet-<release>) and,
# with --node, a real node with its kubelet binary (hack/build-node.sh hack/controlplane-<release>).
# Each is cached outside the repo like the rest of the matrix. Cold: 1.36's two take about 6
# minutes; 1.38.0-beta.0's three about 8, with Go 1.27 (the modules' toolchain line; the go
# command fetches it).
#
# Prints one `export VAR=DIR` line per build (MIGDRA_CONTROLPLANE_136_BIN, MIGDRA_KUBELET_136_BIN;
# for 1.38 also MIGDRA_NODE_138_BIN), the variables hack/test.sh runs that release with; the rest
# goes to stderr. hack/matrix.sh evaluates them; .ci/run runs this in the background and hack/test.sh
# waits for its log (MIGDRA_RELEASE_136_LOG, MIGDRA_RELEASE_138_LOG).
# Usage: hack/build-release.sh 1.36 | hack/build-release.sh 1.38 --node
set -euo pipefail
cd "$(dirname "$0")/.."
release=${1:-}
[[ -d hack/controlplane-$release && -d hack/kubelet-$release ]] ||
  { echo "usage: $0 RELEASE [--node]: no hack/controlplane-$release or hack/kubelet-$release (known: $(cd hack && echo controlplane-1.* | sed 's/controlplane-//g'))" >&2; exit 2; }
suffix=${release//./}
builds=("MIGDRA_CONTROLPLANE_${suffix}_BIN hack/build-controlplane.sh hack/controlplane-$release"
  "MIGDRA_KUBELET_${suffix}_BIN hack/build-kubelet.sh hack/kubelet-$release")
case ${2:-} in
  --node) builds+=("MIGDRA_NODE_${suffix}_BIN hack/build-node.sh hack/controlplane-$release") ;;
  '') ;;
  *) echo "$0: unknown option '$2' (valid: --node)" >&2; exit 2 ;;
esac
for build in "${builds[@]}"; do
  read -r var script module <<<"$build"
  dir=$(bash "$script" "$module" | tail -n 1)
  [[ -d $dir ]] || { echo "build-release: $script $module printed no bin directory" >&2; exit 1; }
  echo "export $var=$dir"
done
