// Command coredns is CoreDNS v1.15.0 with only the plugins that kubeadm's Corefile uses, for
// the kind node image built here (no registry serves registry.k8s.io/coredns). Upstream's
// main imports every plugin, cloud SDKs included, which takes most of the build; this is
// CoreDNS's documented way to choose plugins at compile time without go generate.
package main

import (
	"slices"

	_ "github.com/coredns/caddy/onevent"
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/metrics"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
)

// kubeadm's Corefile: errors, health, ready, kubernetes, prometheus, forward, cache, loop,
// reload, loadbalance (and log, for debugging).
var plugins = []string{"errors", "health", "ready", "kubernetes", "prometheus", "forward", "cache", "loop",
	"reload", "loadbalance", "log"}

func init() {
	// Upstream's order decides how plugins chain; keep it, minus the plugins not built in.
	dnsserver.Directives = slices.DeleteFunc(slices.Clone(dnsserver.Directives), func(name string) bool {
		return !slices.Contains(plugins, name)
	})
}

func main() {
	coremain.Run()
}
