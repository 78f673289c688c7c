// NVML's entry points for where a GPU sits, as a DGX answers them: NUMA node and memory affinity,
// PCIe common ancestors, and NVLinks to NVSwitches.

package main

/*
#include <stdlib.h>
*/
import "C"

import (
	"unsafe"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Topology as on a DGX: two CPU sockets, the first half of the GPUs on NUMA node 0 and the rest on
// node 1 (nvmlDeviceGetNumaNodeId and nvmlDeviceGetMemoryAffinity say so); GPUs in pairs behind one PCIe switch (DGX A100 and H100 system manuals); every NVLink of
// a GPU active and going to an NVSwitch (links spread over the switches in turn).

func level(a, b *GPU) nvml.GpuTopologyLevel {
	switch {
	case a.Index == b.Index:
		return nvml.TOPOLOGY_INTERNAL
	case a.Index/2 == b.Index/2:
		return nvml.TOPOLOGY_MULTIPLE
	case a.NumaNode == b.NumaNode:
		return nvml.TOPOLOGY_NODE
	default:
		return nvml.TOPOLOGY_SYSTEM
	}
}

//export nvmlDeviceGetNumaNodeId
func nvmlDeviceGetNumaNodeId(device unsafe.Pointer, node *C.uint) C.int {
	_, _, t, r := gpuDevice("nvmlDeviceGetNumaNodeId", device)
	if r != nvml.SUCCESS {
		return rc(r)
	}
	*node = C.uint(t.gpu.NumaNode)
	return rc(nvml.SUCCESS)
}

// The NUMA nodes (scope NODE) or sockets (scope SOCKET) nearest the GPU's memory, a bit each in
// nodeSet's words (unsigned long): on a DGX one node per socket, so both name the GPU's NumaNode.
//
//export nvmlDeviceGetMemoryAffinity
func nvmlDeviceGetMemoryAffinity(device unsafe.Pointer, nodeSetSize C.uint, nodeSet *C.ulong, scope C.int) C.int {
	_, _, t, r := gpuDevice("nvmlDeviceGetMemoryAffinity", device)
	if r != nvml.SUCCESS {
		return rc(r)
	}
	if nodeSet == nil || nodeSetSize == 0 || (scope != nvml.AFFINITY_SCOPE_NODE && scope != nvml.AFFINITY_SCOPE_SOCKET) {
		return rc(nvml.ERROR_INVALID_ARGUMENT)
	}
	words := unsafe.Slice(nodeSet, int(nodeSetSize))
	clear(words)
	bits := int(unsafe.Sizeof(C.ulong(0))) * 8
	if t.gpu.NumaNode/bits < len(words) {
		words[t.gpu.NumaNode/bits] = C.ulong(1) << (t.gpu.NumaNode % bits)
	}
	return rc(nvml.SUCCESS)
}

//export nvmlDeviceGetTopologyCommonAncestor
func nvmlDeviceGetTopologyCommonAncestor(device1 unsafe.Pointer, device2 unsafe.Pointer, path *C.int) C.int {
	node, state, r := begin("nvmlDeviceGetTopologyCommonAncestor")
	if r != nvml.SUCCESS {
		return rc(r)
	}
	a, r := resolve(node, state, device1, kindDevice)
	if r != nvml.SUCCESS {
		return rc(r)
	}
	b, r := resolve(node, state, device2, kindDevice)
	if r != nvml.SUCCESS {
		return rc(r)
	}
	*path = C.int(level(a.gpu, b.gpu))
	return rc(nvml.SUCCESS)
}

//export nvmlDeviceGetTopologyNearestGpus
func nvmlDeviceGetTopologyNearestGpus(device unsafe.Pointer, at C.int, count *C.uint, devices unsafe.Pointer) C.int {
	node, _, t, r := gpuDevice("nvmlDeviceGetTopologyNearestGpus", device)
	if r != nvml.SUCCESS {
		return rc(r)
	}
	var found []unsafe.Pointer
	for _, other := range node.GPUs {
		if other.Index != t.gpu.Index && level(t.gpu, other) <= nvml.GpuTopologyLevel(at) {
			found = append(found, handleOf(ref{kind: kindDevice, gpu: other.Index}))
		}
	}
	if devices == nil || int(*count) < len(found) {
		*count = C.uint(len(found))
		if devices == nil {
			return rc(nvml.SUCCESS)
		}
		return rc(nvml.ERROR_INSUFFICIENT_SIZE)
	}
	copy(unsafe.Slice((*unsafe.Pointer)(devices), len(found)), found)
	*count = C.uint(len(found))
	return rc(nvml.SUCCESS)
}

func nvlink(call string, device unsafe.Pointer, link C.uint) (*Node, target, nvml.Return) {
	node, _, t, r := gpuDevice(call, device)
	if r == nvml.SUCCESS && int(link) >= t.gpu.NvLinks {
		r = nvml.ERROR_INVALID_ARGUMENT
	}
	return node, t, r
}

//export nvmlDeviceGetNvLinkState
func nvmlDeviceGetNvLinkState(device unsafe.Pointer, link C.uint, active *C.int) C.int {
	_, _, r := nvlink("nvmlDeviceGetNvLinkState", device, link)
	if r != nvml.SUCCESS {
		return rc(r)
	}
	*active = C.int(nvml.FEATURE_ENABLED)
	return rc(nvml.SUCCESS)
}

//export nvmlDeviceGetNvLinkVersion
func nvmlDeviceGetNvLinkVersion(device unsafe.Pointer, link C.uint, version *C.uint) C.int {
	_, t, r := nvlink("nvmlDeviceGetNvLinkVersion", device, link)
	if r != nvml.SUCCESS {
		return rc(r)
	}
	// NVLink 3 on Ampere, 4 on Hopper, 5 on Blackwell (NVML's enum: version + 1).
	generation := uint32(3)
	switch {
	case t.gpu.Architecture >= nvml.DEVICE_ARCH_BLACKWELL:
		generation = 5
	case t.gpu.Architecture >= nvml.DEVICE_ARCH_HOPPER:
		generation = 4
	}
	*version = C.uint(generation + 1)
	return rc(nvml.SUCCESS)
}

//export nvmlDeviceGetNvLinkRemoteDeviceType
func nvmlDeviceGetNvLinkRemoteDeviceType(device unsafe.Pointer, link C.uint, kind *C.int) C.int {
	_, _, r := nvlink("nvmlDeviceGetNvLinkRemoteDeviceType", device, link)
	if r != nvml.SUCCESS {
		return rc(r)
	}
	*kind = C.int(nvml.NVLINK_DEVICE_TYPE_SWITCH)
	return rc(nvml.SUCCESS)
}

//export nvmlDeviceGetNvLinkRemotePciInfo_v2
func nvmlDeviceGetNvLinkRemotePciInfo_v2(device unsafe.Pointer, link C.uint, pci unsafe.Pointer) C.int {
	node, _, r := nvlink("nvmlDeviceGetNvLinkRemotePciInfo_v2", device, link)
	if r != nvml.SUCCESS {
		return rc(r)
	}
	if len(node.Switches) == 0 {
		return rc(nvml.ERROR_NOT_SUPPORTED)
	}
	bus := node.Switches[int(link)%len(node.Switches)]
	info := nvml.PciInfo{PciDeviceId: 0x22a310de}
	fixed(info.BusId[:], bus)
	fixed(info.BusIdLegacy[:], bus[4:])
	var number uint32
	for _, c := range bus[9:11] {
		number = number*16 + uint32(hexDigit(c))
	}
	info.Bus = number
	*(*nvml.PciInfo)(pci) = info
	return rc(nvml.SUCCESS)
}

//export nvmlDeviceGetNvLinkRemotePciInfo
func nvmlDeviceGetNvLinkRemotePciInfo(device unsafe.Pointer, link C.uint, pci unsafe.Pointer) C.int {
	return nvmlDeviceGetNvLinkRemotePciInfo_v2(device, link, pci)
}

func hexDigit(c rune) int {
	switch {
	case c >= '0' && c <= '9':
		return int(c - '0')
	case c >= 'a' && c <= 'f':
		return int(c-'a') + 10
	case c >= 'A' && c <= 'F':
		return int(c-'A') + 10
	}
	return 0
}
