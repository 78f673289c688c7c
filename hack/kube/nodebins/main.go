// Command nodebins is one multi-call binary holding what a kind node runs
// from Kubernetes: kubelet, kubeadm, kubectl and kube-proxy, built from the
// same module graph as the control plane (../go.mod). It dispatches on the
// name it was called by, so symlinks named after each behave like the
// upstream binaries, or on its first argument:
//
//	nodebins kubeadm init ...
//
// It lives in its own package so that the control plane's cache key
// (hack/kube/*.go, go.mod, go.sum) does not move when it changes.
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	_ "k8s.io/client-go/plugin/pkg/client/auth"
	"k8s.io/component-base/cli"
	"k8s.io/component-base/logs"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	kubectl "k8s.io/kubectl/pkg/cmd"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"
	proxy "k8s.io/kubernetes/cmd/kube-proxy/app"
	kubeadm "k8s.io/kubernetes/cmd/kubeadm/app"
	kubeadmerrors "k8s.io/kubernetes/cmd/kubeadm/app/util/errors"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
)

var commands = map[string]func(){
	"kubelet":    func() { os.Exit(cli.Run(kubelet.NewKubeletCommand(context.Background()))) },
	"kube-proxy": func() { os.Exit(cli.Run(proxy.NewProxyCommand())) },
	"kubeadm":    func() { kubeadmerrors.HandleError(kubeadm.Run()) },
	"kubectl": func() {
		// As upstream's cmd/kubectl: verbosity is parsed before the command is built.
		logs.GlogSetter(kubectl.GetLogVerbosity(os.Args)) //nolint:errcheck
		if err := cli.RunNoErrOutput(kubectl.NewDefaultKubectlCommand()); err != nil {
			kubectlutil.CheckErr(err)
		}
	},
}

func main() {
	name := filepath.Base(os.Args[0])
	if _, known := commands[name]; !known && len(os.Args) > 1 {
		name = os.Args[1]
		os.Args = os.Args[1:]
	}
	run, known := commands[name]
	if !known {
		fmt.Fprintf(os.Stderr, "nodebins: unknown command %q; call it as one of: kubelet, kubeadm, kubectl, kube-proxy\n", name)
		os.Exit(2)
	}
	run()
}
