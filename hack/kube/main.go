// Command kubebins is one multi-call binary holding the Kubernetes control
// plane that gpuslice tests run against: kube-apiserver, kube-scheduler,
// kube-controller-manager and etcd, built from Go modules (no Docker, no
// release downloads), and pod-runner, the kubelet stand-in of the fake GPU nodes. It dispatches on the name it was called by, so
// symlinks named after each component behave like the upstream binaries
// (envtest probes them with --help), or on its first argument:
//
//	kubebins kube-apiserver --etcd-servers=...
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"
	"go.etcd.io/etcd/server/v3/etcdmain"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
)

var components = map[string]func() *cobra.Command{
	"kube-apiserver":          apiserver.NewAPIServerCommand,
	"kube-controller-manager": controllermanager.NewControllerManagerCommand,
	"kube-scheduler":          func() *cobra.Command { return scheduler.NewSchedulerCommand() },
}

func main() {
	name, args := filepath.Base(os.Args[0]), os.Args
	if _, known := components[name]; !known && name != "etcd" && name != "pod-runner" && len(os.Args) > 1 {
		name, args = os.Args[1], os.Args[1:]
	}
	if name == "etcd" {
		etcdmain.Main(args)
		return
	}
	if name == "pod-runner" {
		os.Exit(runPodRunner(args[1:]))
	}
	newCommand, known := components[name]
	if !known {
		fmt.Fprintf(os.Stderr, "kubebins: unknown component %q; call it as one of: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, pod-runner\n", name)
		os.Exit(2)
	}
	command := newCommand()
	command.SetArgs(args[1:])
	os.Exit(cli.Run(command))
}
