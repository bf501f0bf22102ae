//go:build tools

// Package tools records, for `go mod tidy`, the commands built from this module: the control
// plane (hack/build-controlplane.sh) and the real node's kubelet and kubectl (hack/build-node.sh).
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
