// Command podnet gives each node of the kind cluster built here its pod
// network, as kindnetd does (the Go module proxy does not serve kindnetd, so
// it cannot be built here): it writes a bridge/host-local CNI config for its
// node's spec.podCIDR, and routes every other node's podCIDR via that node's
// InternalIP. It runs as a DaemonSet on the host network with NODE_NAME set,
// and reads Nodes with its ServiceAccount token. Only the standard library:
// the API through net/http, routes through rtnetlink.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"
)

const serviceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"

type nodeList struct {
	Items []struct {
		Metadata struct {
			Name string `json:"name"`
		} `json:"metadata"`
		Spec struct {
			PodCIDRs []string `json:"podCIDRs"`
		} `json:"spec"`
		Status struct {
			Addresses []struct {
				Type    string `json:"type"`
				Address string `json:"address"`
			} `json:"addresses"`
		} `json:"status"`
	} `json:"items"`
}

func main() {
	self := os.Getenv("NODE_NAME")
	if self == "" {
		log.Fatal("podnet: NODE_NAME is not set (set it from spec.nodeName)")
	}
	confDir := envOr("CNI_CONF_DIR", "/etc/cni/net.d")
	client, base, err := apiClient()
	if err != nil {
		log.Fatalf("podnet: %v", err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	routes := map[string]string{} // podCIDR -> gateway we installed
	for {
		if err := sync(ctx, client, base, self, confDir, routes); err != nil {
			log.Printf("podnet: %v (retrying)", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(5 * time.Second):
		}
	}
}

func envOr(name, fallback string) string {
	if value := os.Getenv(name); value != "" {
		return value
	}
	return fallback
}

func apiClient() (*http.Client, string, error) {
	host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
	if host == "" || port == "" {
		return nil, "", fmt.Errorf("not in a cluster: KUBERNETES_SERVICE_HOST/PORT are unset")
	}
	ca, err := os.ReadFile(filepath.Join(serviceAccountDir, "ca.crt"))
	if err != nil {
		return nil, "", err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return nil, "", fmt.Errorf("no certificate in %s/ca.crt", serviceAccountDir)
	}
	transport := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}
	return &http.Client{Transport: transport, Timeout: 30 * time.Second}, "https://" + net.JoinHostPort(host, port), nil
}

func sync(ctx context.Context, client *http.Client, base, self, confDir string, routes map[string]string) error {
	// The token is re-read each time: projected tokens rotate.
	token, err := os.ReadFile(filepath.Join(serviceAccountDir, "token"))
	if err != nil {
		return err
	}
	request, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/api/v1/nodes", nil)
	if err != nil {
		return err
	}
	request.Header.Set("Authorization", "Bearer "+string(token))
	response, err := client.Do(request)
	if err != nil {
		return err
	}
	defer response.Body.Close()
	if response.StatusCode != http.StatusOK {
		return fmt.Errorf("listing nodes: %s", response.Status)
	}
	var nodes nodeList
	if err := json.NewDecoder(response.Body).Decode(&nodes); err != nil {
		return err
	}
	wanted := map[string]string{}
	for _, node := range nodes.Items {
		if node.Metadata.Name == self {
			if err := writeConfig(confDir, node.Spec.PodCIDRs); err != nil {
				return err
			}
			continue
		}
		gateway := ""
		for _, address := range node.Status.Addresses {
			if address.Type == "InternalIP" && net.ParseIP(address.Address).To4() != nil {
				gateway = address.Address
			}
		}
		for _, cidr := range node.Spec.PodCIDRs {
			if _, network, err := net.ParseCIDR(cidr); err == nil && network.IP.To4() != nil && gateway != "" {
				wanted[cidr] = gateway
			}
		}
	}
	for cidr, gateway := range wanted {
		// Replaced every time: a route someone removed comes back.
		if err := route(syscall.RTM_NEWROUTE, cidr, gateway); err != nil {
			return fmt.Errorf("route %s via %s: %w", cidr, gateway, err)
		}
		if routes[cidr] != gateway {
			log.Printf("podnet: route %s via %s", cidr, gateway)
			routes[cidr] = gateway
		}
	}
	for cidr, gateway := range routes {
		if _, still := wanted[cidr]; !still {
			if err := route(syscall.RTM_DELROUTE, cidr, gateway); err != nil && err != syscall.ESRCH {
				return fmt.Errorf("removing route %s: %w", cidr, err)
			}
			log.Printf("podnet: removed route %s via %s (node gone)", cidr, gateway)
			delete(routes, cidr)
		}
	}
	return nil
}

// writeConfig writes the node's CNI config (atomically, and only when it
// changes); the kubelet reports the node Ready once it exists.
func writeConfig(dir string, podCIDRs []string) error {
	var ranges [][]map[string]string
	for _, cidr := range podCIDRs {
		ranges = append(ranges, []map[string]string{{"subnet": cidr}})
	}
	if len(ranges) == 0 {
		return fmt.Errorf("this node has no spec.podCIDR yet")
	}
	config := map[string]any{
		"cniVersion": "1.0.0",
		"name":       "podnet",
		"plugins": []any{
			map[string]any{
				"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": true, "hairpinMode": true,
				"ipam": map[string]any{"type": "host-local", "ranges": ranges, "routes": []any{map[string]string{"dst": "0.0.0.0/0"}}},
			},
			map[string]any{"type": "portmap", "capabilities": map[string]bool{"portMappings": true}},
		},
	}
	data, err := json.MarshalIndent(config, "", "  ")
	if err != nil {
		return err
	}
	path := filepath.Join(dir, "10-podnet.conflist")
	if current, err := os.ReadFile(path); err == nil && string(current) == string(data) {
		return nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(path+".tmp", data, 0o644); err != nil {
		return err
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		return err
	}
	log.Printf("podnet: wrote %s for %v", path, podCIDRs)
	return nil
}

// route adds (replacing) or deletes an IPv4 route in the main table through rtnetlink.
func route(kind uint16, cidr, gateway string) error {
	_, dst, err := net.ParseCIDR(cidr)
	if err != nil {
		return err
	}
	gw := net.ParseIP(gateway).To4()
	ones, _ := dst.Mask.Size()
	fd, err := syscall.Socket(syscall.AF_NETLINK, syscall.SOCK_RAW|syscall.SOCK_CLOEXEC, syscall.NETLINK_ROUTE)
	if err != nil {
		return err
	}
	defer syscall.Close(fd)
	if err := syscall.Bind(fd, &syscall.SockaddrNetlink{Family: syscall.AF_NETLINK}); err != nil {
		return err
	}
	flags := uint16(syscall.NLM_F_REQUEST | syscall.NLM_F_ACK)
	if kind == syscall.RTM_NEWROUTE {
		flags |= syscall.NLM_F_CREATE | syscall.NLM_F_REPLACE
	}
	body := []byte{
		syscall.AF_INET, byte(ones), 0, 0, // family, dst_len, src_len, tos
		syscall.RT_TABLE_MAIN, syscall.RTPROT_STATIC, syscall.RT_SCOPE_UNIVERSE, syscall.RTN_UNICAST,
		0, 0, 0, 0, // flags
	}
	body = appendAttr(body, syscall.RTA_DST, dst.IP.To4())
	body = appendAttr(body, syscall.RTA_GATEWAY, gw)
	message := make([]byte, syscall.NLMSG_HDRLEN, syscall.NLMSG_HDRLEN+len(body))
	binary.NativeEndian.PutUint32(message[0:], uint32(syscall.NLMSG_HDRLEN+len(body)))
	binary.NativeEndian.PutUint16(message[4:], kind)
	binary.NativeEndian.PutUint16(message[6:], flags)
	binary.NativeEndian.PutUint32(message[8:], 1) // sequence
	message = append(message, body...)
	if err := syscall.Sendto(fd, message, 0, &syscall.SockaddrNetlink{Family: syscall.AF_NETLINK}); err != nil {
		return err
	}
	reply := make([]byte, 4096)
	n, _, err := syscall.Recvfrom(fd, reply, 0)
	if err != nil {
		return err
	}
	replies, err := syscall.ParseNetlinkMessage(reply[:n])
	if err != nil {
		return err
	}
	for _, m := range replies {
		if m.Header.Type == syscall.NLMSG_ERROR && len(m.Data) >= 4 {
			if code := int32(binary.NativeEndian.Uint32(m.Data[:4])); code != 0 {
				return syscall.Errno(-code)
			}
			return nil
		}
	}
	return fmt.Errorf("no acknowledgement from rtnetlink")
}

func appendAttr(buffer []byte, kind uint16, data []byte) []byte {
	header := make([]byte, syscall.SizeofRtAttr)
	binary.NativeEndian.PutUint16(header[0:], uint16(syscall.SizeofRtAttr+len(data)))
	binary.NativeEndian.PutUint16(header[2:], kind)
	buffer = append(append(buffer, header...), data...)
	for len(buffer)%4 != 0 {
		buffer = append(buffer, 0)
	}
	return buffer
}
