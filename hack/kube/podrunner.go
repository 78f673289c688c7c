package main

// pod-runner: a kubelet stand-in for gpuslice's fake GPU nodes, built from the
// kubelet's own plugin manager and DRA manager. Plugin registration, version
// negotiation, NodePrepareResources/NodeUnprepareResources, the checkpoint and
// the wiping of a vanished plugin's ResourceSlices are therefore the kubelet's
// behaviour, not ours. Containers are not started: what each container would
// receive (CDI edits resolved with the CDI library, as runtimes do) is written
// to a JSON file and the pod is reported Running. It serves the kubelet's
// PodResources API from the kubelet's own server code (podresources.go).

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	coordinationv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/kubelet/cm/dra"
	"k8s.io/kubernetes/pkg/kubelet/config"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager"
	"k8s.io/utils/ptr"
	"tags.cncf.io/container-device-interface/pkg/cdi"
)

type podRunner struct {
	client   kubernetes.Interface
	node     string
	root     string
	recorder record.EventRecorder
	dra      *dra.Manager
	pods     cache.Indexer
	queue    workqueue.TypedRateLimitingInterface[string]

	// The workers handle different pods at once (the queue never hands out one key twice at
	// a time), so the set they share is guarded.
	mu       sync.Mutex
	prepared sets.Set[string] // pod UIDs whose containers have been recorded
}

func (r *podRunner) isPrepared(uid string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.prepared.Has(uid)
}

func (r *podRunner) setPrepared(uid string, prepared bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if prepared {
		r.prepared.Insert(uid)
	} else {
		r.prepared.Delete(uid)
	}
}

func runPodRunner(args []string) int {
	fs := flag.NewFlagSet("pod-runner", flag.ContinueOnError)
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig with the node's identity (system:node:<name>)")
	node := fs.String("node", "", "the node this runner stands in for")
	root := fs.String("root", "", "node state directory: plugins_registry/, plugins/, cdi/, dra-state/, containers/,"+
		" pod-resources/")
	renew := fs.Duration("lease-renew", 5*time.Second, "how often the node Lease is renewed")
	klog.InitFlags(fs)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *kubeconfig == "" || *node == "" || *root == "" {
		fmt.Fprintln(os.Stderr, "pod-runner: --kubeconfig, --node and --root are required")
		return 2
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer cancel()
	logger := klog.FromContext(ctx).WithValues("node", *node)
	ctx = klog.NewContext(ctx, logger)

	restConfig, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		logger.Error(err, "cannot read kubeconfig")
		return 1
	}
	client := kubernetes.NewForConfigOrDie(restConfig)
	for _, dir := range []string{"plugins_registry", "plugins", "cdi", "dra-state", "containers"} {
		if err := os.MkdirAll(filepath.Join(*root, dir), 0o750); err != nil {
			logger.Error(err, "cannot create state directory")
			return 1
		}
	}

	// Like a kubelet started before its Node object exists: say so and keep trying.
	_ = wait.PollUntilContextCancel(ctx, 2*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := client.CoreV1().Nodes().Get(ctx, *node, metav1.GetOptions{})
		if err != nil {
			logger.Info("waiting for the Node object", "err", err.Error())
			return false, nil
		}
		return true, nil
	})
	if ctx.Err() != nil {
		return 0
	}

	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
	defer broadcaster.Shutdown()
	r := &podRunner{
		client:   client,
		node:     *node,
		root:     *root,
		recorder: broadcaster.NewRecorder(scheme.Scheme, v1.EventSource{Component: "kubelet", Host: *node}),
		queue:    workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]()),
		prepared: sets.New[string](),
	}
	defer r.queue.ShutDown()

	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTweakListOptions(
		func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", *node).String()
		}))
	informer := factory.Core().V1().Pods().Informer()
	r.pods = informer.GetIndexer()
	_, _ = informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { r.enqueue(obj) },
		UpdateFunc: func(_, obj any) { r.enqueue(obj) },
	})

	r.dra, err = dra.NewManager(logger, client, filepath.Join(*root, "dra-state"))
	if err != nil {
		logger.Error(err, "cannot start the DRA manager")
		return 1
	}
	sourcesReady := config.NewSourcesReady(func(sets.Set[string]) bool { return informer.HasSynced() })
	getNode := func(ctx context.Context) (*v1.Node, error) {
		return client.CoreV1().Nodes().Get(ctx, *node, metav1.GetOptions{})
	}
	if err := r.dra.Start(ctx, r.activePods, getNode, sourcesReady); err != nil {
		logger.Error(err, "cannot start the DRA manager")
		return 1
	}
	defer stopDRA(r.dra)
	plugins := pluginmanager.NewPluginManager(filepath.Join(*root, "plugins_registry"), r.recorder)
	plugins.AddHandler("DRAPlugin", r.dra.GetWatcherHandler())
	go plugins.Run(ctx, sourcesReady, ctx.Done())

	factory.Start(ctx.Done())
	go r.heartbeat(ctx, *renew)
	go r.healthUpdates(ctx)
	go r.servePodResources(ctx)
	for i := 0; i < 4; i++ {
		go wait.UntilWithContext(ctx, r.work, time.Second)
	}
	logger.Info("pod runner started", "root", *root)
	<-ctx.Done()
	logger.Info("pod runner stopping")
	// The deferred clean-up talks to an apiserver that may be going down with us (events are
	// retried for minutes): a stopped node must not linger, so it gets a bounded time.
	time.AfterFunc(shutdownGrace, func() {
		logger.Info("clean-up did not finish in time; exiting", "grace", shutdownGrace)
		klog.Flush()
		os.Exit(0)
	})
	return 0
}

const shutdownGrace = 5 * time.Second

func (r *podRunner) enqueue(obj any) {
	if key, err := cache.MetaNamespaceKeyFunc(obj); err == nil {
		r.queue.Add(key)
	}
}

func (r *podRunner) activePods() []*v1.Pod {
	var active []*v1.Pod
	for _, obj := range r.pods.List() {
		pod := obj.(*v1.Pod)
		if pod.Status.Phase != v1.PodSucceeded && pod.Status.Phase != v1.PodFailed {
			active = append(active, pod)
		}
	}
	return active
}

func (r *podRunner) work(ctx context.Context) {
	for {
		key, quit := r.queue.Get()
		if quit {
			return
		}
		if err := r.sync(ctx, key); err != nil {
			klog.FromContext(ctx).Info("pod not ready yet, will retry", "pod", key, "err", err.Error())
			r.queue.AddRateLimited(key)
		} else {
			r.queue.Forget(key)
		}
		r.queue.Done(key)
	}
}

func (r *podRunner) sync(ctx context.Context, key string) error {
	obj, exists, err := r.pods.GetByKey(key)
	if err != nil || !exists {
		return err
	}
	pod := obj.(*v1.Pod)
	if pod.DeletionTimestamp != nil {
		return r.finishDeletion(ctx, pod)
	}
	if pod.Status.Phase == v1.PodRunning && r.isPrepared(string(pod.UID)) {
		return r.updateResourceHealth(ctx, pod)
	}
	if err := r.dra.PrepareResources(ctx, pod); err != nil {
		r.recorder.Eventf(pod, v1.EventTypeWarning, "FailedPrepareDynamicResources",
			"Failed to prepare dynamic resources: %v", err)
		return err
	}
	for i := range pod.Spec.Containers {
		if err := r.record(pod, &pod.Spec.Containers[i]); err != nil {
			r.recorder.Eventf(pod, v1.EventTypeWarning, "Failed", "Error: %v", err)
			return err
		}
	}
	r.setPrepared(string(pod.UID), true)
	if pod.Status.Phase == v1.PodRunning {
		return r.updateResourceHealth(ctx, pod)
	}
	return r.markRunning(ctx, pod)
}

// record resolves the container's CDI devices against the node's CDI specs,
// as a container runtime would, and writes what the container would receive.
func (r *podRunner) record(pod *v1.Pod, container *v1.Container) error {
	info, err := r.dra.GetResources(pod, container)
	if err != nil {
		return err
	}
	var ids []string
	for _, device := range info.CDIDevices {
		ids = append(ids, device.Name)
	}
	spec := &oci.Spec{Process: &oci.Process{}, Linux: &oci.Linux{}}
	if len(ids) > 0 {
		registry, err := cdi.NewCache(cdi.WithSpecDirs(filepath.Join(r.root, "cdi")), cdi.WithAutoRefresh(false))
		if err != nil {
			return fmt.Errorf("CDI spec directory: %w", err)
		}
		// As containerd does: a spec that does not parse is reported, and fails only the
		// containers whose devices then cannot be resolved, not every pod on the node.
		var broken []string
		for path, specErrs := range registry.GetErrors() {
			broken = append(broken, fmt.Sprintf("CDI spec %s does not parse: %v", path, specErrs))
		}
		sort.Strings(broken)
		if unresolved, err := registry.InjectDevices(spec, ids...); err != nil {
			if len(broken) > 0 {
				err = fmt.Errorf("%w; %s", err, strings.Join(broken, "; "))
			}
			return fmt.Errorf("CDI devices %v could not be resolved: %w", unresolved, err)
		}
		for _, problem := range broken {
			klog.Background().Info("ignoring a CDI spec that does not parse", "problem", problem)
		}
	}
	out := map[string]any{
		"pod": pod.Namespace + "/" + pod.Name, "container": container.Name, "cdiDevices": ids,
		"env": spec.Process.Env, "deviceNodes": spec.Linux.Devices, "mounts": spec.Mounts,
	}
	dir := filepath.Join(r.root, "containers", pod.Namespace+"_"+pod.Name+"_"+string(pod.UID))
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return err
	}
	data, _ := json.MarshalIndent(out, "", "  ")
	klog.Background().Info("container would start", "pod", klog.KObj(pod), "container", container.Name,
		"cdiDevices", ids, "env", spec.Process.Env)
	return os.WriteFile(filepath.Join(dir, container.Name+".json"), data, 0o640)
}

func (r *podRunner) markRunning(ctx context.Context, pod *v1.Pod) error {
	now := metav1.Now()
	updated := pod.DeepCopy()
	status := &updated.Status
	status.Phase = v1.PodRunning
	status.HostIP, status.HostIPs = "127.0.0.1", []v1.HostIP{{IP: "127.0.0.1"}}
	if status.StartTime == nil {
		status.StartTime = &now
	}
	for _, kind := range []v1.PodConditionType{"PodReadyToStartContainers", v1.PodInitialized, v1.ContainersReady, v1.PodReady} {
		setCondition(status, v1.PodCondition{Type: kind, Status: v1.ConditionTrue, LastTransitionTime: now})
	}
	status.ContainerStatuses = nil
	for _, c := range pod.Spec.Containers {
		status.ContainerStatuses = append(status.ContainerStatuses, v1.ContainerStatus{
			Name: c.Name, Image: c.Image, ImageID: "gpuslice-fake://" + c.Image,
			ContainerID: "gpuslice-fake://" + string(pod.UID) + "/" + c.Name,
			Ready:       true, Started: ptr.To(true),
			State: v1.ContainerState{Running: &v1.ContainerStateRunning{StartedAt: now}},
		})
	}
	// As the kubelet's status manager does: the health of each container's allocated devices.
	updateAllocatedResourcesStatus(klog.FromContext(ctx), r.dra, pod, status)
	_, err := r.client.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, updated, metav1.UpdateOptions{})
	if err == nil {
		r.recorder.Eventf(pod, v1.EventTypeNormal, "Started", "Containers recorded (gpuslice fake node: not executed)")
	}
	return err
}

// healthUpdates syncs the pods whose devices' health changed, as the kubelet's sync loop does
// on its container manager's updates (the DRA manager feeds them from the plugins' health streams).
func (r *podRunner) healthUpdates(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case update := <-r.dra.Updates():
			uids := sets.New(update.PodUIDs...)
			for _, obj := range r.pods.List() {
				if pod := obj.(*v1.Pod); uids.Has(string(pod.UID)) {
					r.enqueue(pod)
				}
			}
		}
	}
}

// updateResourceHealth writes the health of a running pod's allocated devices into its container
// statuses (allocatedResourcesStatus), when it differs from what the pod shows.
func (r *podRunner) updateResourceHealth(ctx context.Context, pod *v1.Pod) error {
	updated := pod.DeepCopy()
	updateAllocatedResourcesStatus(klog.FromContext(ctx), r.dra, pod, &updated.Status)
	same := true
	for i := range pod.Status.ContainerStatuses {
		if i >= len(updated.Status.ContainerStatuses) || !reflect.DeepEqual(
			normalizedHealth(pod.Status.ContainerStatuses[i].AllocatedResourcesStatus),
			normalizedHealth(updated.Status.ContainerStatuses[i].AllocatedResourcesStatus)) {
			same = false
		}
	}
	if same {
		return nil
	}
	_, err := r.client.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, updated, metav1.UpdateOptions{})
	return err
}

// normalizedHealth orders statuses by name (the DRA manager rebuilds them from a map).
func normalizedHealth(statuses []v1.ResourceStatus) []v1.ResourceStatus {
	out := append([]v1.ResourceStatus(nil), statuses...)
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	if len(out) == 0 {
		return nil
	}
	return out
}

func setCondition(status *v1.PodStatus, condition v1.PodCondition) {
	for i := range status.Conditions {
		if status.Conditions[i].Type == condition.Type {
			status.Conditions[i] = condition
			return
		}
	}
	status.Conditions = append(status.Conditions, condition)
}

// finishDeletion unprepares the pod's claims and removes the pod, as a kubelet
// does once its containers have stopped.
func (r *podRunner) finishDeletion(ctx context.Context, pod *v1.Pod) error {
	if err := r.dra.UnprepareResources(ctx, pod); err != nil {
		r.recorder.Eventf(pod, v1.EventTypeWarning, "FailedUnprepareDynamicResources",
			"Failed to unprepare dynamic resources: %v", err)
		return err
	}
	r.setPrepared(string(pod.UID), false)
	_ = os.RemoveAll(filepath.Join(r.root, "containers", pod.Namespace+"_"+pod.Name+"_"+string(pod.UID)))
	err := r.client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
		GracePeriodSeconds: ptr.To[int64](0), Preconditions: metav1.NewUIDPreconditions(string(pod.UID)),
	})
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil
	}
	return err
}

// heartbeat renews the node's Lease and keeps its Ready condition fresh, so the
// node-lifecycle controller sees a live node; a stopped runner lets both lapse.
func (r *podRunner) heartbeat(ctx context.Context, every time.Duration) {
	logger := klog.FromContext(ctx)
	leases := r.client.CoordinationV1().Leases(v1.NamespaceNodeLease)
	duration := int32(4 * every / time.Second)
	wait.UntilWithContext(ctx, func(ctx context.Context) {
		now := metav1.NewMicroTime(time.Now())
		lease, err := leases.Get(ctx, r.node, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			node, nerr := r.client.CoreV1().Nodes().Get(ctx, r.node, metav1.GetOptions{})
			if nerr != nil {
				logger.Info("node lease: cannot read the Node", "err", nerr.Error())
				return
			}
			_, err = leases.Create(ctx, &coordinationv1.Lease{
				ObjectMeta: metav1.ObjectMeta{Name: r.node, OwnerReferences: []metav1.OwnerReference{{
					APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID}}},
				Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(r.node), LeaseDurationSeconds: &duration, RenewTime: &now},
			}, metav1.CreateOptions{})
		case err == nil:
			lease.Spec.HolderIdentity, lease.Spec.LeaseDurationSeconds, lease.Spec.RenewTime = ptr.To(r.node), &duration, &now
			_, err = leases.Update(ctx, lease, metav1.UpdateOptions{})
		}
		if err != nil {
			logger.Info("node lease not renewed", "err", err.Error())
		}
		r.reportReady(ctx)
	}, every)
}

func (r *podRunner) reportReady(ctx context.Context) {
	node, err := r.client.CoreV1().Nodes().Get(ctx, r.node, metav1.GetOptions{})
	if err != nil {
		return
	}
	now := metav1.Now()
	ready := v1.NodeCondition{Type: v1.NodeReady, Status: v1.ConditionTrue, Reason: "KubeletReady",
		Message: "gpuslice pod runner is posting ready status", LastHeartbeatTime: now, LastTransitionTime: now}
	for i, c := range node.Status.Conditions {
		if c.Type != v1.NodeReady {
			continue
		}
		if c.Status == v1.ConditionTrue {
			ready.LastTransitionTime = c.LastTransitionTime
		}
		if c.Status == v1.ConditionTrue && c.Reason == ready.Reason && now.Sub(c.LastHeartbeatTime.Time) < time.Minute {
			return // fresh enough: the Lease is the heartbeat, as with a real kubelet
		}
		node.Status.Conditions[i] = ready
		_, _ = r.client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{})
		return
	}
	node.Status.Conditions = append(node.Status.Conditions, ready)
	_, _ = r.client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{})
}
