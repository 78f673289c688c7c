// NVML's entry points for processes, their SM utilisation, and XID and ECC events: what
// `gpuslice fake-gpu` sets in the state file, as NVML would report it.

package main

/*
#include <stdlib.h>
*/
import "C"

import (
	"sync"
	"time"
	"unsafe"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Processes, their SM utilisation, and XID and ECC events: what `gpuslice fake-gpu use` and
// `fault` write in the state file, as NVML would report it.

// processesOn is what runs on a GPU (not in MIG mode) or on one MIG device. A process set on a GPU
// in MIG mode without a MIG device runs on its first one.
func processesOn(t target) []Process {
	var found []Process
	devices := migDevices(t.st)
	for _, p := range t.st.Processes {
		switch {
		case t.isMig():
			if p.MigUUID == t.ci.UUID || (p.MigUUID == "" && len(devices) > 0 && devices[0].ci.UUID == t.ci.UUID) {
				found = append(found, p)
			}
		case !migEnabled(t.st):
			found = append(found, p)
		}
	}
	return found
}

// listProcesses answers as the C library does: the count and INSUFFICIENT_SIZE when the array is
// missing or short (SUCCESS and 0 when there are none). In MIG mode the parent GPU's handle gives
// the aggregate of its MIG devices (nvml.h, to a privileged caller).
func listProcesses(call string, device unsafe.Pointer, count *C.uint, infos unsafe.Pointer, mps bool) C.int {
	node, t, r := anyDevice(call, device)
	if r != nvml.SUCCESS {
		return rc(r)
	}
	if count == nil {
		return rc(nvml.ERROR_INVALID_ARGUMENT)
	}
	if failure, ok := failed(node, call, t.gpu.Index); ok {
		return rc(failure)
	}
	if t.st.Lost {
		return rc(nvml.ERROR_GPU_IS_LOST)
	}
	var listed []Process
	if !t.isMig() && migEnabled(t.st) {
		listed = t.st.Processes
	} else {
		listed = processesOn(t)
	}
	var found []nvml.ProcessInfo
	for _, p := range listed {
		if p.Mps != mps {
			continue
		}
		info := nvml.ProcessInfo{Pid: p.Pid, UsedGpuMemory: p.Memory, GpuInstanceId: 0xFFFFFFFF,
			ComputeInstanceId: 0xFFFFFFFF}
		for _, d := range migDevices(t.st) {
			if d.ci.UUID == p.MigUUID {
				info.GpuInstanceId, info.ComputeInstanceId = d.gi.ID, d.ci.ID
			}
		}
		found = append(found, info)
	}
	if len(found) == 0 {
		*count = 0
		return rc(nvml.SUCCESS)
	}
	if infos == nil || int(*count) < len(found) {
		*count = C.uint(len(found))
		return rc(nvml.ERROR_INSUFFICIENT_SIZE)
	}
	copy(unsafe.Slice((*nvml.ProcessInfo)(infos), len(found)), found)
	*count = C.uint(len(found))
	return rc(nvml.SUCCESS)
}

//export nvmlDeviceGetComputeRunningProcesses_v3
func nvmlDeviceGetComputeRunningProcesses_v3(device unsafe.Pointer, count *C.uint, infos unsafe.Pointer) C.int {
	return listProcesses("nvmlDeviceGetComputeRunningProcesses_v3", device, count, infos, false)
}

//export nvmlDeviceGetComputeRunningProcesses_v2
func nvmlDeviceGetComputeRunningProcesses_v2(device unsafe.Pointer, count *C.uint, infos unsafe.Pointer) C.int {
	return listProcesses("nvmlDeviceGetComputeRunningProcesses_v2", device, count, infos, false)
}

//export nvmlDeviceGetMPSComputeRunningProcesses_v3
func nvmlDeviceGetMPSComputeRunningProcesses_v3(device unsafe.Pointer, count *C.uint, infos unsafe.Pointer) C.int {
	return listProcesses("nvmlDeviceGetMPSComputeRunningProcesses_v3", device, count, infos, true)
}

//export nvmlDeviceGetMPSComputeRunningProcesses_v2
func nvmlDeviceGetMPSComputeRunningProcesses_v2(device unsafe.Pointer, count *C.uint, infos unsafe.Pointer) C.int {
	return listProcesses("nvmlDeviceGetMPSComputeRunningProcesses_v2", device, count, infos, true)
}

//export nvmlDeviceGetGraphicsRunningProcesses_v3
func nvmlDeviceGetGraphicsRunningProcesses_v3(device unsafe.Pointer, count *C.uint, infos unsafe.Pointer) C.int {
	_, _, r := anyDevice("nvmlDeviceGetGraphicsRunningProcesses_v3", device)
	if r == nvml.SUCCESS && count != nil {
		*count = 0
	}
	return rc(r)
}

// One sample per busy process, stamped now: NVML samples continuously, so each call after the
// caller's last timestamp has new ones. NOT_FOUND when there is none newer.
//
//export nvmlDeviceGetProcessUtilization
func nvmlDeviceGetProcessUtilization(device unsafe.Pointer, samples unsafe.Pointer, count *C.uint,
	since C.ulonglong) C.int {
	_, t, r := gpuDeviceOrMig("nvmlDeviceGetProcessUtilization", device)
	if r != nvml.SUCCESS {
		return rc(r)
	}
	if count == nil {
		return rc(nvml.ERROR_INVALID_ARGUMENT)
	}
	now := uint64(time.Now().UnixMicro())
	var found []nvml.ProcessUtilizationSample
	for _, p := range t.st.Processes {
		if p.Sm > 0 && now > uint64(since) {
			found = append(found, nvml.ProcessUtilizationSample{Pid: p.Pid, TimeStamp: now,
				SmUtil: uint32(p.Sm*100 + 0.5)})
		}
	}
	if len(found) == 0 {
		return rc(nvml.ERROR_NOT_FOUND)
	}
	if samples == nil || int(*count) < len(found) {
		*count = C.uint(len(found))
		return rc(nvml.ERROR_INSUFFICIENT_SIZE)
	}
	copy(unsafe.Slice((*nvml.ProcessUtilizationSample)(samples), len(found)), found)
	*count = C.uint(len(found))
	return rc(nvml.SUCCESS)
}

func gpuDeviceOrMig(call string, handle unsafe.Pointer) (*Node, target, nvml.Return) {
	return anyDevice(call, handle)
}

// Events: a set sees the events posted after it was made, on the GPUs registered with it.

type eventSet struct {
	seen       int
	registered map[int]uint64 // GPU index -> event types
}

var (
	setMu   sync.Mutex
	sets    = map[int]*eventSet{}
	setNext int
)

const supportedEvents = nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError |
	nvml.EventTypeSingleBitEccError

//export nvmlEventSetCreate
func nvmlEventSetCreate(set unsafe.Pointer) C.int {
	_, state, r := begin("nvmlEventSetCreate")
	if r != nvml.SUCCESS {
		return rc(r)
	}
	setMu.Lock()
	setNext++
	id := setNext
	sets[id] = &eventSet{seen: state.Seq, registered: map[int]uint64{}}
	setMu.Unlock()
	out(set, handleOf(ref{kind: kindEventSet, set: id, gpu: 0}))
	return rc(nvml.SUCCESS)
}

//export nvmlDeviceGetSupportedEventTypes
func nvmlDeviceGetSupportedEventTypes(device unsafe.Pointer, types *C.ulonglong) C.int {
	_, _, r := anyDevice("nvmlDeviceGetSupportedEventTypes", device)
	if r != nvml.SUCCESS {
		return rc(r)
	}
	*types = C.ulonglong(supportedEvents)
	return rc(nvml.SUCCESS)
}

//export nvmlDeviceRegisterEvents
func nvmlDeviceRegisterEvents(device unsafe.Pointer, types C.ulonglong, set unsafe.Pointer) C.int {
	_, _, t, r := gpuDevice("nvmlDeviceRegisterEvents", device)
	if r != nvml.SUCCESS {
		return rc(r)
	}
	if uint64(types)&^supportedEvents != 0 {
		return rc(nvml.ERROR_NOT_SUPPORTED)
	}
	which, ok := refOf(set)
	if !ok || which.kind != kindEventSet {
		return rc(nvml.ERROR_INVALID_ARGUMENT)
	}
	setMu.Lock()
	defer setMu.Unlock()
	found := sets[which.set]
	if found == nil {
		return rc(nvml.ERROR_INVALID_ARGUMENT)
	}
	found.registered[t.gpu.Index] |= uint64(types)
	return rc(nvml.SUCCESS)
}

// eventData is nvmlEventData_t.
type eventData struct {
	Device            uintptr
	EventType         uint64
	EventData         uint64
	GpuInstanceID     uint32
	ComputeInstanceID uint32
}

//export nvmlEventSetWait_v2
func nvmlEventSetWait_v2(set unsafe.Pointer, data unsafe.Pointer, timeout C.uint) C.int {
	trace("nvmlEventSetWait_v2")
	which, ok := refOf(set)
	if !ok || which.kind != kindEventSet || data == nil {
		return rc(nvml.ERROR_INVALID_ARGUMENT)
	}
	deadline := time.Now().Add(time.Duration(timeout) * time.Millisecond)
	for {
		if !initialised() {
			return rc(nvml.ERROR_UNINITIALIZED)
		}
		node, err := loadNode()
		if err != nil {
			return rc(nvml.ERROR_DRIVER_NOT_LOADED)
		}
		state, err := snapshot(node)
		if err != nil {
			return rc(nvml.ERROR_UNKNOWN)
		}
		if found, ok := nextEvent(node, state, which.set); ok {
			*(*eventData)(data) = found
			return rc(nvml.SUCCESS)
		}
		if !time.Now().Before(deadline) {
			return rc(nvml.ERROR_TIMEOUT)
		}
		time.Sleep(min(50*time.Millisecond, time.Until(deadline)))
	}
}

func nextEvent(node *Node, state *State, id int) (eventData, bool) {
	setMu.Lock()
	defer setMu.Unlock()
	set := sets[id]
	if set == nil {
		return eventData{}, false
	}
	best, bestGPU := Event{Seq: -1}, -1
	for index := range node.GPUs {
		types, ok := set.registered[index]
		if !ok {
			continue
		}
		for _, event := range state.view(node, index).Events {
			if event.Seq > set.seen && event.Type&types != 0 && (best.Seq < 0 || event.Seq < best.Seq) {
				best, bestGPU = event, index
			}
		}
	}
	if bestGPU < 0 {
		return eventData{}, false
	}
	set.seen = best.Seq
	return eventData{Device: uintptr(handleOf(ref{kind: kindDevice, gpu: bestGPU})), EventType: best.Type,
		EventData: best.Data, GpuInstanceID: 0xFFFFFFFF, ComputeInstanceID: 0xFFFFFFFF}, true
}

//export nvmlEventSetFree
func nvmlEventSetFree(set unsafe.Pointer) C.int {
	trace("nvmlEventSetFree")
	which, ok := refOf(set)
	if !ok || which.kind != kindEventSet {
		return rc(nvml.ERROR_INVALID_ARGUMENT)
	}
	setMu.Lock()
	delete(sets, which.set)
	setMu.Unlock()
	return rc(nvml.SUCCESS)
}
