// NVML's entry points for initialisation, the system, and a device's identity, memory and PCI
// information.

package main

/*
#include <stdlib.h>
*/
import "C"

import (
	"strings"
	"unsafe"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Initialisation, the system, and a device's identity.

//export nvmlInitWithFlags
func nvmlInitWithFlags(flags C.uint) C.int {
	trace("nvmlInitWithFlags")
	if _, err := loadNode(); err != nil {
		warn("%v", err)
		return rc(nvml.ERROR_DRIVER_NOT_LOADED)
	}
	initMu.Lock()
	initCount++
	initMu.Unlock()
	return rc(nvml.SUCCESS)
}

//export nvmlInit_v2
func nvmlInit_v2() C.int { return nvmlInitWithFlags(0) }

//export nvmlInit
func nvmlInit() C.int { return nvmlInitWithFlags(0) }

//export nvmlShutdown
func nvmlShutdown() C.int {
	trace("nvmlShutdown")
	initMu.Lock()
	defer initMu.Unlock()
	if initCount == 0 {
		return rc(nvml.ERROR_UNINITIALIZED)
	}
	initCount--
	return rc(nvml.SUCCESS)
}

//export nvmlErrorString
func nvmlErrorString(result C.int) *C.char { return errorString(nvml.Return(result)) }

//export nvmlSystemGetDriverVersion
func nvmlSystemGetDriverVersion(version *C.char, length C.uint) C.int {
	node, _, r := begin("nvmlSystemGetDriverVersion")
	if r != nvml.SUCCESS {
		return rc(r)
	}
	return rc(cString(version, length, node.DriverVersion))
}

//export nvmlSystemGetNVMLVersion
func nvmlSystemGetNVMLVersion(version *C.char, length C.uint) C.int {
	node, _, r := begin("nvmlSystemGetNVMLVersion")
	if r != nvml.SUCCESS {
		return rc(r)
	}
	return rc(cString(version, length, node.NvmlVersion))
}

//export nvmlSystemGetCudaDriverVersion
func nvmlSystemGetCudaDriverVersion(version *C.int) C.int {
	node, _, r := begin("nvmlSystemGetCudaDriverVersion")
	if r != nvml.SUCCESS {
		return rc(r)
	}
	*version = C.int(node.CudaDriverVersion)
	return rc(nvml.SUCCESS)
}

//export nvmlSystemGetCudaDriverVersion_v2
func nvmlSystemGetCudaDriverVersion_v2(version *C.int) C.int {
	return nvmlSystemGetCudaDriverVersion(version)
}

//export nvmlDeviceGetCount_v2
func nvmlDeviceGetCount_v2(count *C.uint) C.int {
	node, _, r := begin("nvmlDeviceGetCount_v2")
	if r != nvml.SUCCESS {
		return rc(r)
	}
	*count = C.uint(len(node.GPUs))
	return rc(nvml.SUCCESS)
}

//export nvmlDeviceGetCount
func nvmlDeviceGetCount(count *C.uint) C.int { return nvmlDeviceGetCount_v2(count) }

//export nvmlDeviceGetHandleByIndex_v2
func nvmlDeviceGetHandleByIndex_v2(index C.uint, device unsafe.Pointer) C.int {
	node, _, r := begin("nvmlDeviceGetHandleByIndex_v2")
	if r != nvml.SUCCESS {
		return rc(r)
	}
	if int(index) >= len(node.GPUs) || device == nil {
		return rc(nvml.ERROR_INVALID_ARGUMENT)
	}
	out(device, handleOf(ref{kind: kindDevice, gpu: int(index)}))
	return rc(nvml.SUCCESS)
}

//export nvmlDeviceGetHandleByIndex
func nvmlDeviceGetHandleByIndex(index C.uint, device unsafe.Pointer) C.int {
	return nvmlDeviceGetHandleByIndex_v2(index, device)
}

// A GPU's UUID, or a MIG device's (NVML answers both); NOT_FOUND for any other.
//
//export nvmlDeviceGetHandleByUUID
func nvmlDeviceGetHandleByUUID(uuid *C.char, device unsafe.Pointer) C.int {
	node, state, r := begin("nvmlDeviceGetHandleByUUID")
	if r != nvml.SUCCESS {
		return rc(r)
	}
	if uuid == nil || device == nil {
		return rc(nvml.ERROR_INVALID_ARGUMENT)
	}
	wanted := C.GoString(uuid)
	for _, gpu := range node.GPUs {
		if gpu.UUID == wanted {
			out(device, handleOf(ref{kind: kindDevice, gpu: gpu.Index}))
			return rc(nvml.SUCCESS)
		}
		for _, gi := range state.view(node, gpu.Index).Instances {
			for _, ci := range gi.Computes {
				if ci.UUID == wanted {
					out(device, handleOf(ref{kind: kindMig, gpu: gpu.Index, gi: gi.ID, ci: ci.ID}))
					return rc(nvml.SUCCESS)
				}
			}
		}
	}
	return rc(nvml.ERROR_NOT_FOUND)
}

//export nvmlDeviceGetHandleByPciBusId_v2
func nvmlDeviceGetHandleByPciBusId_v2(busID *C.char, device unsafe.Pointer) C.int {
	node, _, r := begin("nvmlDeviceGetHandleByPciBusId_v2")
	if r != nvml.SUCCESS {
		return rc(r)
	}
	if busID == nil || device == nil {
		return rc(nvml.ERROR_INVALID_ARGUMENT)
	}
	wanted := strings.ToLower(C.GoString(busID))
	for _, gpu := range node.GPUs {
		short := strings.ToLower(gpu.BusID[4:])
		if wanted == strings.ToLower(gpu.BusID) || wanted == short {
			out(device, handleOf(ref{kind: kindDevice, gpu: gpu.Index}))
			return rc(nvml.SUCCESS)
		}
	}
	return rc(nvml.ERROR_NOT_FOUND)
}

//export nvmlDeviceGetHandleByPciBusId
func nvmlDeviceGetHandleByPciBusId(busID *C.char, device unsafe.Pointer) C.int {
	return nvmlDeviceGetHandleByPciBusId_v2(busID, device)
}

// anyDevice is the target of a GPU or MIG device handle for a read call.
func anyDevice(call string, handle unsafe.Pointer) (*Node, target, nvml.Return) {
	node, state, r := begin(call)
	if r != nvml.SUCCESS {
		return nil, target{}, r
	}
	t, r := resolve(node, state, handle, kindDevice, kindMig)
	return node, t, r
}

//export nvmlDeviceGetName
func nvmlDeviceGetName(device unsafe.Pointer, name *C.char, length C.uint) C.int {
	_, t, r := anyDevice("nvmlDeviceGetName", device)
	if r != nvml.SUCCESS {
		return rc(r)
	}
	if t.isMig() {
		return rc(cString(name, length, t.gpu.Name+" MIG "+t.prof.Name))
	}
	return rc(cString(name, length, t.gpu.Name))
}

//export nvmlDeviceGetUUID
func nvmlDeviceGetUUID(device unsafe.Pointer, uuid *C.char, length C.uint) C.int {
	_, t, r := anyDevice("nvmlDeviceGetUUID", device)
	if r != nvml.SUCCESS {
		return rc(r)
	}
	if t.isMig() {
		return rc(cString(uuid, length, t.ci.UUID))
	}
	return rc(cString(uuid, length, t.gpu.UUID))
}

//export nvmlDeviceGetIndex
func nvmlDeviceGetIndex(device unsafe.Pointer, index *C.uint) C.int {
	_, t, r := anyDevice("nvmlDeviceGetIndex", device)
	if r != nvml.SUCCESS {
		return rc(r)
	}
	*index = C.uint(t.gpu.Index)
	return rc(nvml.SUCCESS)
}

// A MIG device has no minor number of its own (its parent's /dev/nvidiaN and its capabilities).
//
//export nvmlDeviceGetMinorNumber
func nvmlDeviceGetMinorNumber(device unsafe.Pointer, minor *C.uint) C.int {
	_, t, r := anyDevice("nvmlDeviceGetMinorNumber", device)
	if r != nvml.SUCCESS {
		return rc(r)
	}
	if t.isMig() {
		return rc(nvml.ERROR_NOT_SUPPORTED)
	}
	*minor = C.uint(t.gpu.Index)
	return rc(nvml.SUCCESS)
}

//export nvmlDeviceGetBrand
func nvmlDeviceGetBrand(device unsafe.Pointer, brand *C.int) C.int {
	_, t, r := anyDevice("nvmlDeviceGetBrand", device)
	if r != nvml.SUCCESS {
		return rc(r)
	}
	*brand = C.int(t.gpu.Brand)
	return rc(nvml.SUCCESS)
}

//export nvmlDeviceGetArchitecture
func nvmlDeviceGetArchitecture(device unsafe.Pointer, arch *C.uint) C.int {
	_, t, r := anyDevice("nvmlDeviceGetArchitecture", device)
	if r != nvml.SUCCESS {
		return rc(r)
	}
	*arch = C.uint(t.gpu.Architecture)
	return rc(nvml.SUCCESS)
}

//export nvmlDeviceGetCudaComputeCapability
func nvmlDeviceGetCudaComputeCapability(device unsafe.Pointer, major *C.int, minor *C.int) C.int {
	_, t, r := anyDevice("nvmlDeviceGetCudaComputeCapability", device)
	if r != nvml.SUCCESS {
		return rc(r)
	}
	*major, *minor = C.int(t.gpu.CudaMajor), C.int(t.gpu.CudaMinor)
	return rc(nvml.SUCCESS)
}

// memoryOf is a GPU's (or MIG device's) total and what its processes use.
func memoryOf(t target) (total, used uint64) {
	total = t.gpu.Memory
	if t.isMig() {
		total = t.prof.Info.MemorySizeMB * 1024 * 1024
	}
	for _, p := range processesOn(t) {
		used += p.Memory
	}
	return total, min(used, total)
}

//export nvmlDeviceGetMemoryInfo
func nvmlDeviceGetMemoryInfo(device unsafe.Pointer, memory unsafe.Pointer) C.int {
	node, t, r := anyDevice("nvmlDeviceGetMemoryInfo", device)
	if r != nvml.SUCCESS {
		return rc(r)
	}
	if failure, ok := failed(node, "nvmlDeviceGetMemoryInfo", t.gpu.Index); ok {
		return rc(failure)
	}
	if t.st.Lost {
		return rc(nvml.ERROR_GPU_IS_LOST)
	}
	total, used := memoryOf(t)
	*(*nvml.Memory)(memory) = nvml.Memory{Total: total, Used: used, Free: total - used}
	return rc(nvml.SUCCESS)
}

//export nvmlDeviceGetMemoryInfo_v2
func nvmlDeviceGetMemoryInfo_v2(device unsafe.Pointer, memory unsafe.Pointer) C.int {
	_, t, r := anyDevice("nvmlDeviceGetMemoryInfo_v2", device)
	if r != nvml.SUCCESS {
		return rc(r)
	}
	if t.st.Lost {
		return rc(nvml.ERROR_GPU_IS_LOST)
	}
	total, used := memoryOf(t)
	info := (*nvml.Memory_v2)(memory)
	version := info.Version
	*info = nvml.Memory_v2{Version: version, Total: total, Used: used, Free: total - used}
	return rc(nvml.SUCCESS)
}

func fillPci(gpu *GPU, info *nvml.PciInfo) {
	*info = nvml.PciInfo{Domain: 0, Bus: uint32(gpu.Bus), Device: 0, PciDeviceId: gpu.PciDeviceID,
		PciSubSystemId: 0x16c110de}
	fixed(info.BusId[:], gpu.BusID)
	fixed(info.BusIdLegacy[:], gpu.BusID[4:])
}

// A MIG device answers its parent's PCI information.
//
//export nvmlDeviceGetPciInfo_v3
func nvmlDeviceGetPciInfo_v3(device unsafe.Pointer, pci unsafe.Pointer) C.int {
	_, t, r := anyDevice("nvmlDeviceGetPciInfo_v3", device)
	if r != nvml.SUCCESS {
		return rc(r)
	}
	fillPci(t.gpu, (*nvml.PciInfo)(pci))
	return rc(nvml.SUCCESS)
}

//export nvmlDeviceGetPciInfo_v2
func nvmlDeviceGetPciInfo_v2(device unsafe.Pointer, pci unsafe.Pointer) C.int {
	return nvmlDeviceGetPciInfo_v3(device, pci)
}

//export nvmlDeviceGetPciInfo
func nvmlDeviceGetPciInfo(device unsafe.Pointer, pci unsafe.Pointer) C.int {
	return nvmlDeviceGetPciInfo_v3(device, pci)
}

// The device plugin and nvidia-smi ask these; a data-center GPU answers them so.

//export nvmlDeviceGetComputeMode
func nvmlDeviceGetComputeMode(device unsafe.Pointer, mode *C.int) C.int {
	_, _, r := anyDevice("nvmlDeviceGetComputeMode", device)
	if r != nvml.SUCCESS {
		return rc(r)
	}
	*mode = C.int(nvml.COMPUTEMODE_DEFAULT)
	return rc(nvml.SUCCESS)
}

//export nvmlDeviceGetPersistenceMode
func nvmlDeviceGetPersistenceMode(device unsafe.Pointer, mode *C.int) C.int {
	_, _, r := anyDevice("nvmlDeviceGetPersistenceMode", device)
	if r != nvml.SUCCESS {
		return rc(r)
	}
	*mode = C.int(nvml.FEATURE_ENABLED)
	return rc(nvml.SUCCESS)
}

//export nvmlDeviceGetSerial
func nvmlDeviceGetSerial(device unsafe.Pointer, serial *C.char, length C.uint) C.int {
	_, t, r := anyDevice("nvmlDeviceGetSerial", device)
	if r != nvml.SUCCESS {
		return rc(r)
	}
	return rc(cString(serial, length, "165"+strings.ReplaceAll(t.gpu.UUID[4:14], "-", "")))
}
