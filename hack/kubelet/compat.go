package main

// The calls whose signatures changed between the Kubernetes versions this program is built
// against; this is the 1.36 side (hack/kubelet-1.34/compat.go is the 1.34 one).

import (
	"context"

	v1 "k8s.io/api/core/v1"
	"k8s.io/kubernetes/pkg/kubelet/cm/dra"
	"k8s.io/kubernetes/pkg/kubelet/config"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager"
)

func startDRA(ctx context.Context, m *dra.Manager, activePods dra.ActivePodsFunc, getNode func(context.Context) (*v1.Node, error), ready config.SourcesReady) error {
	return m.Start(ctx, activePods, getNode, ready)
}

func runPluginManager(ctx context.Context, pm pluginmanager.PluginManager, ready config.SourcesReady, stop <-chan struct{}) {
	pm.Run(ctx, ready, stop)
}
