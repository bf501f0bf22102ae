// The 1.38 kubelet's iptables package (sigs.k8s.io/iptables-wrappers, which the module proxy here
// refuses: 403), replaced for the real node's kubelet (hack/build-node.sh hack/controlplane-1.38)
// by a node without iptables. The kubelet only uses it to keep a hint chain and a canary for other
// components (kube-proxy); with no iptables it logs "No iptables support on this system" and goes
// on, as it does on an nftables-only host.
module sigs.k8s.io/iptables-wrappers

go 1.26.0
