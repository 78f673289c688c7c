//go:build kube136

package main

// What the pod runner calls of the kubelet that differs between Kubernetes minors, as 1.36 has
// it (built with -tags kube136 against go.1.36.mod): its DRA manager has no Stop (its loops end
// with the context), takes no logger for the health of a pod's devices, and the podresources
// providers take pod UIDs and container names rather than objects, and no logger.

import (
	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/kubernetes/pkg/kubelet/cm/dra"
)

func stopDRA(*dra.Manager) {}

func updateAllocatedResourcesStatus(_ klog.Logger, m *dra.Manager, pod *v1.Pod, status *v1.PodStatus) {
	m.UpdateAllocatedResourcesStatus(pod, status)
}

type noDevices struct{}

func (noDevices) UpdateAllocatedDevices() {}
func (noDevices) GetDevices(string, string) []*podresourcesapi.ContainerDevices {
	return nil
}
func (noDevices) GetAllocatableDevices() []*podresourcesapi.ContainerDevices { return nil }

type noCPUs struct{}

func (noCPUs) GetCPUs(string, string) []int64 { return nil }
func (noCPUs) GetAllocatableCPUs() []int64    { return nil }

type noMemory struct{}

func (noMemory) GetMemory(string, string) []*podresourcesapi.ContainerMemory { return nil }
func (noMemory) GetAllocatableMemory() []*podresourcesapi.ContainerMemory    { return nil }

func (d dynamicResources) GetDynamicResources(pod *v1.Pod, container *v1.Container) []*podresourcesapi.DynamicResource {
	return d.resources(klog.Background(), pod, container)
}
