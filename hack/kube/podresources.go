package main

// The kubelet's PodResources API on a fake node: the kubelet's own v1 server
// (k8s.io/kubernetes/pkg/kubelet/apis/podresources) behind the kubelet's own rate
// limiter, on a unix socket as the kubelet serves it
// (/var/lib/kubelet/pod-resources/kubelet.sock; here <root>/pod-resources/kubelet.sock).
// Its providers are the pod runner's: the active pods of its informer, and each
// container's DRA claims from the DRA manager, turned into the API's DynamicResource
// as the kubelet's container manager does (cm/container_manager_linux.go,
// GetDynamicResources). A fake node has no device plugins, CPU or memory managers,
// so those providers answer nothing (podresources_*.go: their interfaces differ between
// Kubernetes minors).

import (
	"context"
	"net"
	"os"
	"path/filepath"

	"google.golang.org/grpc"
	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
	apisgrpc "k8s.io/kubernetes/pkg/kubelet/apis/grpc"
	"k8s.io/kubernetes/pkg/kubelet/apis/podresources"
)

// podResourcesSocket is where the fake node serves the API, relative to its root.
const podResourcesSocket = "pod-resources/kubelet.sock"

// podsProvider: the pods the runner admitted, as the kubelet's pod manager would list them.
type podsProvider struct{ r *podRunner }

func (p podsProvider) GetActivePods() []*v1.Pod { return p.r.activePods() }

func (p podsProvider) GetPods() []*v1.Pod {
	var all []*v1.Pod
	for _, obj := range p.r.pods.List() {
		all = append(all, obj.(*v1.Pod))
	}
	return all
}

func (p podsProvider) GetPodByName(namespace, name string) (*v1.Pod, bool) {
	obj, exists, err := p.r.pods.GetByKey(namespace + "/" + name)
	if err != nil || !exists {
		return nil, false
	}
	return obj.(*v1.Pod), true
}

// dynamicResources: what the kubelet's container manager answers, from the same DRA manager
// (its provider method, whose signature differs between minors, is in podresources_*.go).
type dynamicResources struct{ r *podRunner }

func (d dynamicResources) resources(logger klog.Logger, pod *v1.Pod, container *v1.Container) []*podresourcesapi.DynamicResource {
	infos, err := d.r.dra.GetContainerClaimInfos(pod, container)
	if err != nil {
		logger.Error(err, "Unable to get container claim info state")
		return []*podresourcesapi.DynamicResource{}
	}
	var found []*podresourcesapi.DynamicResource
	for _, info := range infos {
		var claimResources []*podresourcesapi.ClaimResource
		for driverName, driverState := range info.DriverState {
			for _, device := range driverState.Devices {
				var cdiDevices []*podresourcesapi.CDIDevice
				for _, id := range device.CDIDeviceIDs {
					cdiDevices = append(cdiDevices, &podresourcesapi.CDIDevice{Name: id})
				}
				claimResources = append(claimResources, &podresourcesapi.ClaimResource{
					CdiDevices: cdiDevices, DriverName: driverName, PoolName: device.PoolName,
					DeviceName: device.DeviceName, ShareId: (*string)(device.ShareID),
				})
			}
		}
		found = append(found, &podresourcesapi.DynamicResource{
			ClaimName: info.ClaimName, ClaimNamespace: info.Namespace, ClaimResources: claimResources,
		})
	}
	return found
}

// servePodResources serves the API until ctx ends (as the kubelet's ListenAndServePodResources
// does, which exits the process on a listener error; here the runner goes on without it).
func (r *podRunner) servePodResources(ctx context.Context) {
	logger := klog.FromContext(ctx)
	socket := filepath.Join(r.root, podResourcesSocket)
	if err := os.MkdirAll(filepath.Dir(socket), 0o750); err != nil {
		logger.Error(err, "cannot create the pod-resources directory")
		return
	}
	_ = os.Remove(socket) // a socket left by an earlier run
	listener, err := (&net.ListenConfig{}).Listen(ctx, "unix", socket)
	if err != nil {
		logger.Error(err, "cannot listen for the podresources API", "socket", socket)
		return
	}
	providers := podresources.PodResourcesProviders{
		Pods: podsProvider{r}, Devices: noDevices{}, Cpus: noCPUs{}, Memory: noMemory{},
		DynamicResources: dynamicResources{r},
	}
	server := grpc.NewServer(apisgrpc.WithRateLimiter(ctx, "podresources", podresources.DefaultQPS,
		podresources.DefaultBurstTokens))
	podresourcesapi.RegisterPodResourcesListerServer(server, podresources.NewV1PodResourcesServer(ctx, providers))
	go func() {
		<-ctx.Done()
		server.Stop()
	}()
	logger.Info("Starting to serve the podresources API", "endpoint", socket)
	if err := server.Serve(listener); err != nil && ctx.Err() == nil {
		logger.Error(err, "podresources server stopped")
	}
}
