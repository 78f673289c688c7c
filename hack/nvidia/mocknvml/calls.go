// What every entry point shares: its trace line, the check that NVML is initialised, the
// handle resolved to what it names, injected failures, and NVML's strings and return codes.

package main

/*
#include <stdlib.h>
*/
import "C"

import (
	"os"
	"sync"
	"unsafe"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// What every entry point does first: it is traced, NVML must be initialised, and an injected
// failure answers before the call does anything.

const traceEnv = "GPUSLICE_MOCK_NVML_TRACE"

var (
	initMu    sync.Mutex
	initCount int
	traceMu   sync.Mutex
)

// trace appends the call's name to the file GPUSLICE_MOCK_NVML_TRACE names, so that a test can
// see which entry points a consumer (nvidia-ctk, the device plugin) used, and whether one of them
// was a stub.
func trace(call string) {
	path := getenv(traceEnv)
	if path == "" {
		return
	}
	traceMu.Lock()
	defer traceMu.Unlock()
	file, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return
	}
	defer file.Close()
	_, _ = file.WriteString(call + "\n")
}

func initialised() bool {
	initMu.Lock()
	defer initMu.Unlock()
	return initCount > 0
}

// begin is the node and its state for a call, or the error NVML answers before doing anything.
func begin(call string) (*Node, *State, nvml.Return) {
	trace(call)
	if !initialised() {
		return nil, nil, nvml.ERROR_UNINITIALIZED
	}
	node, err := loadNode()
	if err != nil {
		warn("%v", err)
		return nil, nil, nvml.ERROR_DRIVER_NOT_LOADED
	}
	state, err := snapshot(node)
	if err != nil {
		warn("%v", err)
		return nil, nil, nvml.ERROR_CORRUPTED_INFOROM
	}
	return node, state, nvml.SUCCESS
}

// device is the GPU a device handle names (the parent of a MIG device's); for a MIG device, the
// MIG device too. An instance destroyed since the handle was made is INVALID_ARGUMENT, as NVML
// answers for a stale handle.
type target struct {
	gpu  *GPU
	st   *GPUState
	ref  ref
	gi   *GpuInstance
	ci   *ComputeInstance
	prof *Profile
}

func (t target) isMig() bool { return t.ref.kind == kindMig }

func resolve(node *Node, state *State, handle unsafe.Pointer, kinds ...kind) (target, nvml.Return) {
	r, ok := refOf(handle)
	if !ok || r.gpu < 0 || r.gpu >= len(node.GPUs) {
		return target{}, nvml.ERROR_INVALID_ARGUMENT
	}
	allowed := false
	for _, k := range kinds {
		allowed = allowed || k == r.kind
	}
	if !allowed {
		return target{}, nvml.ERROR_INVALID_ARGUMENT
	}
	t := target{gpu: node.GPUs[r.gpu], st: state.view(node, r.gpu), ref: r}
	if r.kind == kindDevice || r.kind == kindEventSet {
		return t, nvml.SUCCESS
	}
	for i := range t.st.Instances {
		if t.st.Instances[i].ID == r.gi {
			t.gi = &t.st.Instances[i]
		}
	}
	if t.gi == nil {
		return target{}, nvml.ERROR_INVALID_ARGUMENT
	}
	t.prof = t.gpu.ByID[t.gi.ProfileID]
	if r.kind == kindGpuInstance {
		return t, nvml.SUCCESS
	}
	for i := range t.gi.Computes {
		if t.gi.Computes[i].ID == r.ci {
			t.ci = &t.gi.Computes[i]
		}
	}
	if t.ci == nil {
		return target{}, nvml.ERROR_INVALID_ARGUMENT
	}
	return t, nvml.SUCCESS
}

// failed is an injected failure's answer for this call on this GPU, if one applies.
func failed(node *Node, call string, gpu int) (nvml.Return, bool) {
	return takeFailure(node, call, gpu)
}

// cString copies value into a caller's buffer of length bytes, as NVML does (INSUFFICIENT_SIZE
// when it does not fit with its NUL).
func cString(buffer *C.char, length C.uint, value string) nvml.Return {
	if buffer == nil {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	if len(value)+1 > int(length) {
		return nvml.ERROR_INSUFFICIENT_SIZE
	}
	target := unsafe.Slice((*byte)(unsafe.Pointer(buffer)), int(length))
	copy(target, value)
	target[len(value)] = 0
	return nvml.SUCCESS
}

func fixed(target []int8, value string) {
	for i := range target {
		target[i] = 0
	}
	for i := 0; i < len(value) && i < len(target)-1; i++ {
		target[i] = int8(value[i])
	}
}

func rc(r nvml.Return) C.int { return C.int(r) }

var errorStrings = map[nvml.Return]*C.char{}
var errorMu sync.Mutex

// errorString is NVML's text for a return code, kept for the process's life as NVML's are.
func errorString(r nvml.Return) *C.char {
	errorMu.Lock()
	defer errorMu.Unlock()
	if found, ok := errorStrings[r]; ok {
		return found
	}
	text, ok := errorTexts[r]
	if !ok {
		text = "Unknown Error"
	}
	found := C.CString(text)
	errorStrings[r] = found
	return found
}

// NVML's own texts (nvmlErrorString) for the codes this library answers.
var errorTexts = map[nvml.Return]string{
	nvml.SUCCESS:                      "Success",
	nvml.ERROR_UNINITIALIZED:          "Uninitialized",
	nvml.ERROR_INVALID_ARGUMENT:       "Invalid Argument",
	nvml.ERROR_NOT_SUPPORTED:          "Not Supported",
	nvml.ERROR_NO_PERMISSION:          "Insufficient Permissions",
	nvml.ERROR_NOT_FOUND:              "Not Found",
	nvml.ERROR_INSUFFICIENT_SIZE:      "Insufficient Size",
	nvml.ERROR_DRIVER_NOT_LOADED:      "Driver Not Loaded",
	nvml.ERROR_TIMEOUT:                "Timeout",
	nvml.ERROR_FUNCTION_NOT_FOUND:     "Function Not Found",
	nvml.ERROR_CORRUPTED_INFOROM:      "Corrupted infoROM",
	nvml.ERROR_GPU_IS_LOST:            "GPU is lost",
	nvml.ERROR_RESET_REQUIRED:         "GPU requires restart",
	nvml.ERROR_IN_USE:                 "In use by another client",
	nvml.ERROR_NO_DATA:                "No data",
	nvml.ERROR_INSUFFICIENT_RESOURCES: "Insufficient Resources",
	nvml.ERROR_UNKNOWN:                "Unknown Error",
}

// mocknvmlStub is what every generated stub (stubs.c) answers.
//
//export mocknvmlStub
func mocknvmlStub(name *C.char) C.int {
	trace("stub:" + C.GoString(name))
	return rc(nvml.ERROR_NOT_SUPPORTED)
}
