// The state every process shares (state.json beside the config, replaced by rename under flock of
// state.lock): MIG mode and instances, processes, a lost GPU, events and injected failures.

package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// State is what a GPU keeps across processes: MIG mode and instances, and what `gpuslice fake-gpu`
// makes happen to it (processes, faults, failing calls). Its JSON is also read and written by
// gpuslice (devcluster/mocknvml.py), under the same flock on state.lock.
type State struct {
	Version  int                  `json:"version"`
	Serial   int                  `json:"serial"` // MIG devices made so far: each gets a new UUID, as on hardware
	Seq      int                  `json:"seq"`    // events posted so far
	GPUs     map[string]*GPUState `json:"gpus"`   // by index
	Failures []Failure            `json:"failures"`
}

// GPUState is one GPU's.
type GPUState struct {
	MigMode    int           `json:"migMode"`
	PendingMig int           `json:"pendingMigMode"` // what a GPU reset makes current
	Lost       bool          `json:"lost"`           // fell off the bus: GPU_IS_LOST
	Instances  []GpuInstance `json:"instances"`
	Processes  []Process     `json:"processes"`
	Events     []Event       `json:"events"`
}

// GpuInstance is a MIG GPU instance.
type GpuInstance struct {
	ID        uint32            `json:"id"`
	ProfileID uint32            `json:"profileId"`
	Start     uint32            `json:"start"`
	Size      uint32            `json:"size"`
	Computes  []ComputeInstance `json:"computeInstances"`
}

// ComputeInstance is a compute instance, and the MIG device it makes.
type ComputeInstance struct {
	ID        uint32 `json:"id"`
	ProfileID uint32 `json:"profileId"`
	Start     uint32 `json:"start"`
	Size      uint32 `json:"size"`
	UUID      string `json:"uuid"`
}

// Process is a process on the GPU, or on one of its MIG devices (by UUID).
type Process struct {
	Pid     uint32  `json:"pid"`
	Memory  uint64  `json:"memory"` // bytes
	Mps     bool    `json:"mps"`    // an MPS client (listed by the MPS call, not the compute one)
	Sm      float64 `json:"sm"`     // share of the SMs it keeps busy, 0..1
	MigUUID string  `json:"migUuid,omitempty"`
}

// Event is an XID or ECC event, seen by every event set made before it.
type Event struct {
	Seq  int    `json:"seq"`
	Type uint64 `json:"type"`
	Data uint64 `json:"data"`
}

// Failure makes the next Remaining calls of Call (on GPU, or any when nil) answer Return; -1: all.
type Failure struct {
	Call      string `json:"call"`
	GPU       *int   `json:"gpu,omitempty"`
	Return    int    `json:"return"`
	Remaining int    `json:"remaining"`
}

const maxEvents = 64

var (
	stateMu    sync.Mutex
	stateCache *State
	stateStamp string
)

func (n *Node) lockPath() string {
	return filepath.Join(filepath.Dir(n.StatePath), "state.lock")
}

func (s *State) gpu(n *Node, index int) *GPUState {
	key := strconv.Itoa(index)
	found, ok := s.GPUs[key]
	if !ok {
		found = &GPUState{}
		if n.GPUs[index].MigInitial && n.GPUs[index].MigCapable() {
			found.MigMode, found.PendingMig = nvml.DEVICE_MIG_ENABLE, nvml.DEVICE_MIG_ENABLE
		}
		s.GPUs[key] = found
	}
	return found
}

// view is one GPU's state for reading (its first state where it has none yet).
func (s *State) view(n *Node, index int) *GPUState {
	if found, ok := s.GPUs[strconv.Itoa(index)]; ok {
		return found
	}
	fresh := &State{GPUs: map[string]*GPUState{}}
	return fresh.gpu(n, index)
}

func fileStamp(path string) (string, error) {
	info, err := os.Stat(path)
	if err != nil {
		return "", err
	}
	var inode uint64
	if sys, ok := info.Sys().(*syscall.Stat_t); ok {
		inode = sys.Ino
	}
	return fmt.Sprintf("%d:%d:%d", inode, info.ModTime().UnixNano(), info.Size()), nil
}

func readState(path string) (*State, error) {
	state := &State{Version: 1, GPUs: map[string]*GPUState{}}
	raw, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return state, nil
	}
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(raw, state); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if state.GPUs == nil {
		state.GPUs = map[string]*GPUState{}
	}
	return state, nil
}

// snapshot is the state as it is now, read again only when the file changed (writers replace it
// by rename, so a reader needs no lock). Callers must not change it.
func snapshot(n *Node) (*State, error) {
	stamp, err := fileStamp(n.StatePath)
	if errors.Is(err, os.ErrNotExist) {
		stamp = "none"
	} else if err != nil {
		return nil, err
	}
	stateMu.Lock()
	defer stateMu.Unlock()
	if stateCache != nil && stateStamp == n.StatePath+"@"+stamp {
		return stateCache, nil
	}
	state, err := readState(n.StatePath)
	if err != nil {
		return nil, err
	}
	stateCache, stateStamp = state, n.StatePath+"@"+stamp
	return state, nil
}

// update applies change to the state under the file lock and writes it back unless change
// answered an error.
func update(n *Node, change func(*State) nvml.Return) nvml.Return {
	if err := os.MkdirAll(filepath.Dir(n.StatePath), 0o755); err != nil {
		return nvml.ERROR_NO_PERMISSION
	}
	lock, err := os.OpenFile(n.lockPath(), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nvml.ERROR_NO_PERMISSION
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return nvml.ERROR_UNKNOWN
	}
	defer func() { _ = syscall.Flock(int(lock.Fd()), syscall.LOCK_UN) }()
	state, err := readState(n.StatePath)
	if err != nil {
		warn("reading the state: %v", err)
		return nvml.ERROR_CORRUPTED_INFOROM
	}
	result := change(state)
	if result != nvml.SUCCESS {
		return result
	}
	if err := writeState(n.StatePath, state); err != nil {
		warn("writing the state: %v", err)
		return nvml.ERROR_UNKNOWN
	}
	return nvml.SUCCESS
}

func writeState(path string, state *State) error {
	for _, st := range state.GPUs { // lists, never null, for the Python side
		if st.Instances == nil {
			st.Instances = []GpuInstance{}
		}
		for i := range st.Instances {
			if st.Instances[i].Computes == nil {
				st.Instances[i].Computes = []ComputeInstance{}
			}
		}
		if st.Processes == nil {
			st.Processes = []Process{}
		}
		if st.Events == nil {
			st.Events = []Event{}
		}
	}
	if state.Failures == nil {
		state.Failures = []Failure{}
	}
	raw, err := json.MarshalIndent(state, "", "  ")
	if err != nil {
		return err
	}
	temporary, err := os.CreateTemp(filepath.Dir(path), ".state-*.tmp")
	if err != nil {
		return err
	}
	defer os.Remove(temporary.Name())
	if _, err := temporary.Write(raw); err != nil {
		temporary.Close()
		return err
	}
	if err := temporary.Sync(); err != nil {
		temporary.Close()
		return err
	}
	if err := temporary.Close(); err != nil {
		return err
	}
	if err := os.Chmod(temporary.Name(), 0o644); err != nil {
		return err
	}
	return os.Rename(temporary.Name(), path)
}

// takeFailure is the return an injected failure gives this call, counted down (under the lock).
func takeFailure(n *Node, call string, gpu int) (nvml.Return, bool) {
	state, err := snapshot(n)
	if err != nil || !hasFailure(state, call, gpu) {
		return nvml.SUCCESS, false
	}
	var found nvml.Return
	taken := false
	update(n, func(s *State) nvml.Return {
		kept := s.Failures[:0]
		for _, failure := range s.Failures {
			if !taken && failure.Call == call && (failure.GPU == nil || *failure.GPU == gpu) && failure.Remaining != 0 {
				found, taken = nvml.Return(failure.Return), true
				if failure.Remaining > 0 {
					failure.Remaining--
				}
			}
			if failure.Remaining != 0 {
				kept = append(kept, failure)
			}
		}
		s.Failures = kept
		return nvml.SUCCESS
	})
	return found, taken
}

func hasFailure(state *State, call string, gpu int) bool {
	for _, failure := range state.Failures {
		if failure.Call == call && (failure.GPU == nil || *failure.GPU == gpu) && failure.Remaining != 0 {
			return true
		}
	}
	return false
}

func warn(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "gpuslice mock NVML: "+format+"\n", args...)
}
