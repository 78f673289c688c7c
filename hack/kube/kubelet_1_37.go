//go:build !kube136

package main

// What the pod runner calls of the kubelet that differs between Kubernetes minors, as 1.37
// (the default build) has it; kubelet_1_36.go has 1.36's (built with -tags kube136 against
// go.1.36.mod).

import (
	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/kubernetes/pkg/kubelet/cm/dra"
)

func stopDRA(m *dra.Manager) { m.Stop() }

func updateAllocatedResourcesStatus(logger klog.Logger, m *dra.Manager, pod *v1.Pod, status *v1.PodStatus) {
	m.UpdateAllocatedResourcesStatus(logger, pod, status)
}

type noDevices struct{}

func (noDevices) UpdateAllocatedDevices(klog.Logger) {}
func (noDevices) GetDevices(string, string) []*podresourcesapi.ContainerDevices {
	return nil
}
func (noDevices) GetAllocatableDevices(klog.Logger) []*podresourcesapi.ContainerDevices {
	return nil
}

type noCPUs struct{}

func (noCPUs) GetCPUs(*v1.Pod, *v1.Container) []int64 { return nil }
func (noCPUs) GetPodCPUs(string) []int64              { return nil }
func (noCPUs) GetAllocatableCPUs() []int64            { return nil }

type noMemory struct{}

func (noMemory) GetMemory(klog.Logger, *v1.Pod, *v1.Container) []*podresourcesapi.ContainerMemory {
	return nil
}
func (noMemory) GetPodMemory(klog.Logger, string) []*podresourcesapi.ContainerMemory { return nil }
func (noMemory) GetAllocatableMemory(klog.Logger) []*podresourcesapi.ContainerMemory { return nil }

func (d dynamicResources) GetDynamicResources(logger klog.Logger, pod *v1.Pod, container *v1.Container) []*podresourcesapi.DynamicResource {
	return d.resources(logger, pod, container)
}
