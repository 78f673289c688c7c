// Handles: the opaque pointers NVML hands out, each naming a GPU, GPU instance, compute instance,
// MIG device or event set, valid in every process that loads the library.

package main

import (
	"sync"
	"unsafe"
)

// What a handle stands for. A handle names a GPU, GPU instance, compute instance or MIG device by
// its identity (GPU index, GPU instance id, compute instance id), never by when it was made: the
// instance behind it lives in the state file and may have been destroyed by another process.
type kind int

const (
	kindDevice kind = iota
	kindMig
	kindGpuInstance
	kindComputeInstance
	kindEventSet
)

type ref struct {
	kind kind
	gpu  int
	gi   uint32
	ci   uint32
	set  int
}

var (
	handleMu  sync.Mutex
	byAddress = map[uintptr]ref{}
	byRef     = map[ref]unsafe.Pointer{}
)

func handleOf(r ref) unsafe.Pointer {
	handleMu.Lock()
	defer handleMu.Unlock()
	if found, ok := byRef[r]; ok {
		return found
	}
	address := newOpaque()
	byRef[r] = address
	byAddress[uintptr(address)] = r
	return address
}

func refOf(handle unsafe.Pointer) (ref, bool) {
	handleMu.Lock()
	defer handleMu.Unlock()
	found, ok := byAddress[uintptr(handle)]
	return found, ok
}

// out writes a handle to a C out-parameter (nvmlDevice_t *, nvmlGpuInstance_t *, ...).
func out(target unsafe.Pointer, handle unsafe.Pointer) {
	*(*unsafe.Pointer)(target) = handle
}
