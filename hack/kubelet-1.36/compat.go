package main

// The calls whose signatures changed between the Kubernetes versions this program is built
// against; this is the 1.36 side (hack/kubelet-1.37/compat.go is the 1.37 one).

import (
	"context"
	"time"

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

func (h recordingHandler) ValidatePlugin(name, endpoint string, versions []string) error {
	return h.validated(name, endpoint, versions, h.inner.ValidatePlugin(name, endpoint, versions))
}

func (h recordingHandler) RegisterPlugin(name, endpoint string, versions []string, timeout *time.Duration) error {
	return h.registered(name, endpoint, versions, h.inner.RegisterPlugin(name, endpoint, versions, timeout))
}

func (h recordingHandler) DeRegisterPlugin(name, endpoint string) {
	h.inner.DeRegisterPlugin(name, endpoint)
	h.deregistered(name, endpoint)
}

func updateAllocatedResourcesStatus(m *dra.Manager, pod *v1.Pod, status *v1.PodStatus) {
	m.UpdateAllocatedResourcesStatus(pod, status)
}
