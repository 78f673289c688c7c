// The node's config (config.json, which gpuslice writes from its catalog) and what it loads into:
// each GPU from go-nvml's DGX mock, with the catalog's figures and the chassis' buses, NUMA nodes and NVLinks.

package main

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxb200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

const (
	configEnv  = "GPUSLICE_MOCK_NVML_CONFIG"
	configDir  = "gpuslice-mock-nvml"
	configName = "config.json"
)

// Config is the node's GPUs, written by gpuslice (devcluster/mocknvml.py) from its catalog.
type Config struct {
	Server            string      `json:"server"` // dgxa100, dgxh100, dgxh200 or dgxb200
	Node              string      `json:"node"`   // the seed of the GPUs' UUIDs
	GPUs              []GPUConfig `json:"gpus"`   // default: the server's eight, as the mock has them
	DriverVersion     string      `json:"driverVersion,omitempty"`
	CudaDriverVersion int         `json:"cudaDriverVersion,omitempty"`
	State             string      `json:"state,omitempty"` // relative to the config's directory
}

// GPUConfig is one GPU: a go-nvml GPU, and what gpuslice's catalog knows better.
type GPUConfig struct {
	Mock      string           `json:"mock,omitempty"` // default: the server's GPU
	Name      string           `json:"name,omitempty"`
	MemoryMiB uint64           `json:"memoryMiB,omitempty"`
	MigMode   bool             `json:"migMode"` // before the state file says otherwise
	NumaNode  *int             `json:"numaNode,omitempty"`
	Profiles  []ProfileOverlay `json:"profiles,omitempty"` // when given, the GPU's only profiles
}

// ProfileOverlay is a MIG profile's figures as `nvidia-smi mig -lgip` shows them.
type ProfileOverlay struct {
	Enum            int      `json:"enum"`
	MemoryMiB       uint64   `json:"memoryMiB"`
	InstanceCount   uint32   `json:"instanceCount"`
	Multiprocessors uint32   `json:"multiprocessors"`
	CopyEngines     uint32   `json:"copyEngines"`
	Decoders        uint32   `json:"decoders"`
	Encoders        uint32   `json:"encoders"`
	JpegEngines     uint32   `json:"jpegEngines"`
	OfaEngines      uint32   `json:"ofaEngines"`
	Starts          []uint32 `json:"starts"`
	Size            uint32   `json:"size"`
}

var mockGPUs = map[string]gpus.Config{
	"a100-sxm4-40gb":  gpus.A100_SXM4_40GB,
	"a100-sxm4-80gb":  gpus.A100_SXM4_80GB,
	"a100-pcie-40gb":  gpus.A100_PCIE_40GB,
	"a100-pcie-80gb":  gpus.A100_PCIE_80GB,
	"a30-pcie-24gb":   gpus.A30_PCIE_24GB,
	"h100-sxm5-80gb":  gpus.H100_SXM5_80GB,
	"h200-sxm5-141gb": gpus.H200_SXM5_141GB,
	"b200-sxm5-180gb": gpus.B200_SXM5_180GB,
}

// What each DGX chassis looks like beyond the mock: PCI buses of its GPUs (DGX A100 and H100
// system manuals), NVLinks per GPU and NVSwitches.
type chassis struct {
	mock     func() *server.Server
	buses    []int
	nvlinks  int
	switches int
}

var servers = map[string]chassis{
	"dgxa100": {dgxa100.New, []int{0x07, 0x0f, 0x47, 0x4e, 0x87, 0x90, 0xb7, 0xbd}, 12, 6},
	"dgxh100": {dgxh100.New, []int{0x1b, 0x43, 0x52, 0x61, 0x9d, 0xc3, 0xd1, 0xdf}, 18, 4},
	"dgxh200": {dgxh200.New, []int{0x1b, 0x43, 0x52, 0x61, 0x9d, 0xc3, 0xd1, 0xdf}, 18, 4},
	"dgxb200": {dgxb200.New, []int{0x1b, 0x43, 0x52, 0x61, 0x9d, 0xc3, 0xd1, 0xdf}, 18, 2},
}

// Node is the loaded config: the system and its GPUs.
type Node struct {
	Dir               string
	StatePath         string
	DriverVersion     string
	NvmlVersion       string
	CudaDriverVersion int
	GPUs              []*GPU
	Switches          []string // NVSwitches' bus ids (NVML's form)
	stamp             string
}

// GPU is one GPU as NVML answers for it.
type GPU struct {
	Index        int
	UUID         string
	BusID        string // NVML's form, 00000000:1B:00.0
	Bus          int
	Name         string
	Architecture nvml.DeviceArchitecture
	Brand        nvml.BrandType
	Memory       uint64 // bytes
	CudaMajor    int
	CudaMinor    int
	PciDeviceID  uint32
	NumaNode     int
	NvLinks      int
	MigInitial   bool
	Profiles     map[int]*Profile    // by NVML's enum
	ByID         map[uint32]*Profile // by NVML's profile id
	OfaTotal     uint32              // the GPU's optical flow accelerators: one +me instance at a time
}

// MigCapable is whether NVML answers MIG calls for the GPU.
func (g *GPU) MigCapable() bool { return len(g.Profiles) > 0 }

var (
	nodeMu    sync.Mutex
	nodeCache *Node
)

func configPath() (string, error) {
	if path := getenv(configEnv); path != "" {
		return path, nil
	}
	lib := libraryPath()
	if lib == "" {
		return "", fmt.Errorf("%s is unset and the loader does not say where this library is", configEnv)
	}
	return filepath.Join(filepath.Dir(lib), configDir, configName), nil
}

// loadNode reads the config again when it changed (a test may switch the node's GPUs).
func loadNode() (*Node, error) {
	path, err := configPath()
	if err != nil {
		return nil, err
	}
	info, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("no mock NVML config: %w", err)
	}
	stamp := fmt.Sprintf("%s:%d:%d", path, info.ModTime().UnixNano(), info.Size())
	nodeMu.Lock()
	defer nodeMu.Unlock()
	if nodeCache != nil && nodeCache.stamp == stamp {
		return nodeCache, nil
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var config Config
	if err := json.Unmarshal(raw, &config); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	node, err := buildNode(config, filepath.Dir(path))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	node.stamp = stamp
	nodeCache = node
	return node, nil
}

func buildNode(config Config, dir string) (*Node, error) {
	kind, ok := servers[config.Server]
	if !ok {
		return nil, fmt.Errorf("server %q is none of dgxa100, dgxh100, dgxh200, dgxb200", config.Server)
	}
	mock := kind.mock()
	node := &Node{
		Dir:               dir,
		StatePath:         filepath.Join(dir, "state.json"),
		DriverVersion:     mock.DriverVersion,
		NvmlVersion:       mock.NvmlVersion,
		CudaDriverVersion: mock.CudaDriverVersion,
	}
	if config.State != "" {
		node.StatePath = config.State
		if !filepath.IsAbs(node.StatePath) {
			node.StatePath = filepath.Join(dir, config.State)
		}
	}
	if config.DriverVersion != "" {
		node.DriverVersion = config.DriverVersion
		node.NvmlVersion = "12." + config.DriverVersion
	}
	if config.CudaDriverVersion != 0 {
		node.CudaDriverVersion = config.CudaDriverVersion
	}
	wanted := config.GPUs
	if len(wanted) == 0 {
		wanted = make([]GPUConfig, len(mock.Devices))
	}
	for s := 0; s < kind.switches; s++ {
		node.Switches = append(node.Switches, fmt.Sprintf("00000000:%02X:00.0", 0xa0+s))
	}
	for index, want := range wanted {
		base := mock.Devices[index%len(mock.Devices)].(*server.Device).Config
		if want.Mock != "" {
			found, ok := mockGPUs[want.Mock]
			if !ok {
				return nil, fmt.Errorf("GPU %d: no go-nvml mock GPU %q", index, want.Mock)
			}
			base = found
		}
		bus := 0x20 + index
		if index < len(kind.buses) {
			bus = kind.buses[index]
		}
		gpu := &GPU{
			Index:        index,
			UUID:         uuidOf("GPU", fmt.Sprintf("%s/%d", config.Node, index)),
			BusID:        fmt.Sprintf("00000000:%02X:00.0", bus),
			Bus:          bus,
			Name:         base.Name,
			Architecture: base.Architecture,
			Brand:        base.Brand,
			Memory:       base.MemoryMB * 1024 * 1024,
			CudaMajor:    base.CudaMajor,
			CudaMinor:    base.CudaMinor,
			PciDeviceID:  base.PciDeviceId,
			NumaNode:     index * 2 / max(len(wanted), 1),
			NvLinks:      kind.nvlinks,
			MigInitial:   want.MigMode,
		}
		if want.Name != "" {
			gpu.Name = want.Name
		}
		if want.MemoryMiB != 0 {
			gpu.Memory = want.MemoryMiB * 1024 * 1024
		}
		if want.NumaNode != nil {
			gpu.NumaNode = *want.NumaNode
		}
		if err := setProfiles(gpu, base, want.Profiles); err != nil {
			return nil, fmt.Errorf("GPU %d: %w", index, err)
		}
		node.GPUs = append(node.GPUs, gpu)
	}
	return node, nil
}

// uuidOf is a UUID in NVML's form (GPU-8-4-4-4-12, lowercase hex), the same for the same seed.
func uuidOf(prefix, seed string) string {
	sum := sha256.Sum256([]byte("gpuslice-mock-nvml/" + prefix + "/" + seed))
	return fmt.Sprintf("%s-%x-%x-%x-%x-%x", prefix, sum[0:4], sum[4:6], sum[6:8], sum[8:10], sum[10:16])
}
