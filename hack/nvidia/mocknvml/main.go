// Command mocknvml is gpuslice's libnvidia-ml.so.1 for fake GPU nodes: NVML's C ABI over the
// GPUs of go-nvml's DGX mocks (github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgx*), built with
// -buildmode=c-shared. pynvml (the agent), nvidia-ctk and NVIDIA's device plugin load it as they
// load the driver's library.
//
// The mocks give the GPUs (names, architectures, compute capabilities, MIG profile tables,
// driver versions). What they leave schematic is set right here (fidelity.go): NVML's profile IDs
// and placements, and, from gpuslice's catalog through the node's config, memory as NVML reports it
// and each profile's SMs and engines. What the mocks keep in one process (MIG mode, GPU and
// compute instances) lives in a state file under a lock instead (state.go), so the agent,
// nvidia-ctk, the device plugin and `gpuslice fake-gpu` see one GPU. Every NVML function this
// library does not implement answers NVML_ERROR_NOT_SUPPORTED (stubs.c, generated from go-nvml's
// nvml.h at build time): an eager loader such as pynvml's CDLL or nvidia-smi needs every symbol.
//
// The config is found through GPUSLICE_MOCK_NVML_CONFIG, else at gpuslice-mock-nvml/config.json
// beside this library (config.go).
package main

/*
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>

static const char *mocknvml_self(void) {
	Dl_info info;
	if (dladdr((void *)mocknvml_self, &info) && info.dli_fname) {
		return info.dli_fname;
	}
	return NULL;
}

static void *mocknvml_alloc(void) { return calloc(1, 16); }
*/
import "C"

import "unsafe"

func main() {}

// libraryPath is where this library was loaded from ("" if the loader does not say).
func libraryPath() string {
	path := C.mocknvml_self()
	if path == nil {
		return ""
	}
	return C.GoString(path)
}

// getenv reads the process's environment as it is now: Go's own copy (os.Getenv) is taken when
// the library is loaded, and a caller such as a test may set a variable after that.
func getenv(name string) string {
	key := C.CString(name)
	defer C.free(unsafe.Pointer(key))
	value := C.getenv(key)
	if value == nil {
		return ""
	}
	return C.GoString(value)
}

// newOpaque is a handle's address: C memory, never freed, never read; NVML's callers only pass it
// back (and Go callers keep it in a pointer, which must not look like Go memory).
func newOpaque() unsafe.Pointer {
	return C.mocknvml_alloc()
}
