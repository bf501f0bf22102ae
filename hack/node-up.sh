#!/usr/bin/env bash
# Try migdra on a real single-node cluster, with no GPU and no cloud: a 1.37 control plane, the
# kubelet binary with containerd and runc, and the Helm chart installed on simulated GPUs
# (h100-80gb:1 and a MIG-off a100-40gb:1) exactly as tests/node/ installs it. Then use kubectl:
#   bash hack/node-up.sh                 # builds what is missing (cached), starts, prints how to connect
#   export KUBECONFIG=/tmp/migdra-node-up/kubeconfig
#   kubectl get resourceslices
#   kubectl apply -n team-a -k daemonset/examples && kubectl -n team-a exec notebook -- env
#   bash hack/node-down.sh               # stops it and removes everything it made
# As root (containerd and the kubelet need it). The simulated GPUs are for trying things out,
# never for production.
set -euo pipefail
cd "$(dirname "$0")/.."
me=node-up
dir=${MIGDRA_NODE_UP_DIR:-/tmp/migdra-node-up}
if [[ -e $dir/pid ]] && kill -0 "$(cat "$dir/pid")" 2>/dev/null; then
	echo "$me: already up (pid $(cat "$dir/pid")); export KUBECONFIG=$dir/kubeconfig, or bash hack/node-down.sh" >&2
	exit 1
fi
rm -rf "$dir" && mkdir -p "$dir"
MIGDRA_CONTROLPLANE_137_BIN=${MIGDRA_CONTROLPLANE_137_BIN:-$(bash hack/build-controlplane.sh hack/controlplane-1.37 | tail -n 1)}
MIGDRA_NODE_BIN=${MIGDRA_NODE_BIN:-$(bash hack/build-node.sh | tail -n 1)}
MIGDRA_HELM=${MIGDRA_HELM:-$(bash hack/build-helm.sh | tail -n 1)}
MIGDRA_IMAGE_ARCHIVE=${MIGDRA_IMAGE_ARCHIVE:-$(bash hack/build-image.sh | tail -n 1)}
export MIGDRA_CONTROLPLANE_137_BIN MIGDRA_NODE_BIN MIGDRA_HELM MIGDRA_IMAGE_ARCHIVE MIGDRA_NODE_UP_DIR=$dir
cargo test --locked --test node --no-run >/dev/null 2>&1 || cargo test --locked --test node --no-run
nohup cargo test --locked --test node -- --ignored --exact node_up --nocapture >"$dir/log" 2>&1 &
echo $! >"$dir/pid"
while [[ ! -e $dir/up ]]; do
	if ! kill -0 "$(cat "$dir/pid")" 2>/dev/null; then
		tail -n 40 "$dir/log" >&2
		echo "$me: failed (log: $dir/log)" >&2
		exit 1
	fi
	sleep 1
done
grep '^\[' "$dir/log" >&2 || true
cat <<END
$me: a node named gpu-node-1 with migdra on simulated GPUs is up.
  export KUBECONFIG=$dir/kubeconfig
  alias kubectl=$(cat "$dir/kubectl")
  kubectl get nodes; kubectl get resourceslices; kubectl -n migdra-system get pods
  kubectl apply -n team-a -k daemonset/examples
Stop it with: bash hack/node-down.sh
END
