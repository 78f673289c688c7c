// NVML's entry points for MIG: the mode (pending until a reset before Hopper), GPU and compute
// instances, their profiles and placements, and MIG device handles.

package main

/*
#include <stdlib.h>
*/
import "C"

import (
	"fmt"
	"sort"
	"unsafe"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// MIG: the mode, GPU and compute instances, and MIG devices, as nvml.h documents each call.

// nvmlGpuInstanceInfo_t and nvmlComputeInstanceInfo_t: go-nvml's own mirrors hold Go interfaces.
type giInfo struct {
	Device    uintptr
	ID        uint32
	ProfileID uint32
	Start     uint32
	Size      uint32
}

type ciInfo struct {
	Device      uintptr
	GpuInstance uintptr
	ID          uint32
	ProfileID   uint32
	Start       uint32
	Size        uint32
}

// The version word of a versioned structure: its size, and the version in the top byte.
func structVersion(version uint32) uint32 { return version >> 24 }

func migEnabled(st *GPUState) bool { return st.MigMode == nvml.DEVICE_MIG_ENABLE }

// gpuDevice is the target of a (parent) GPU handle.
func gpuDevice(call string, handle unsafe.Pointer) (*Node, *State, target, nvml.Return) {
	node, state, r := begin(call)
	if r != nvml.SUCCESS {
		return nil, nil, target{}, r
	}
	t, r := resolve(node, state, handle, kindDevice)
	return node, state, t, r
}

//export nvmlDeviceGetMigMode
func nvmlDeviceGetMigMode(device unsafe.Pointer, current *C.uint, pending *C.uint) C.int {
	_, _, t, r := gpuDevice("nvmlDeviceGetMigMode", device)
	if r != nvml.SUCCESS {
		return rc(r)
	}
	if t.st.Lost {
		return rc(nvml.ERROR_GPU_IS_LOST)
	}
	if !t.gpu.MigCapable() {
		return rc(nvml.ERROR_NOT_SUPPORTED)
	}
	*current, *pending = C.uint(t.st.MigMode), C.uint(t.st.PendingMig)
	return rc(nvml.SUCCESS)
}

// Hopper and later switch at once; before Hopper the mode waits for a GPU reset, which the GPU's
// clients on a node (persistenced, DCGM) keep from happening: activationStatus IN_USE (nvml.h).
// Turning MIG off with GPU instances left is IN_USE.
//
//export nvmlDeviceSetMigMode
func nvmlDeviceSetMigMode(device unsafe.Pointer, mode C.uint, status *C.int) C.int {
	node, _, t, r := gpuDevice("nvmlDeviceSetMigMode", device)
	if r != nvml.SUCCESS {
		return rc(r)
	}
	if failure, ok := failed(node, "nvmlDeviceSetMigMode", t.gpu.Index); ok {
		return rc(failure)
	}
	if !t.gpu.MigCapable() {
		return rc(nvml.ERROR_NOT_SUPPORTED)
	}
	if mode != nvml.DEVICE_MIG_ENABLE && mode != nvml.DEVICE_MIG_DISABLE {
		return rc(nvml.ERROR_INVALID_ARGUMENT)
	}
	activation := nvml.SUCCESS
	r = update(node, func(s *State) nvml.Return {
		st := s.gpu(node, t.gpu.Index)
		if st.Lost {
			return nvml.ERROR_GPU_IS_LOST
		}
		if mode == nvml.DEVICE_MIG_DISABLE && len(st.Instances) > 0 {
			return nvml.ERROR_IN_USE
		}
		st.PendingMig = int(mode)
		if t.gpu.Architecture >= nvml.DEVICE_ARCH_HOPPER {
			st.MigMode = int(mode)
		} else if st.MigMode != int(mode) {
			activation = nvml.ERROR_IN_USE
		}
		return nvml.SUCCESS
	})
	if r == nvml.SUCCESS && status != nil {
		*status = C.int(activation)
	}
	return rc(r)
}

func profileByEnum(t target, profileEnum C.uint) (*Profile, nvml.Return) {
	if int(profileEnum) >= nvml.GPU_INSTANCE_PROFILE_COUNT {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	profile, ok := t.gpu.Profiles[int(profileEnum)]
	if !ok {
		return nil, nvml.ERROR_NOT_SUPPORTED
	}
	return profile, nvml.SUCCESS
}

// v1 answers on any MIG-capable GPU, whatever its mode; it carries no name.
//
//export nvmlDeviceGetGpuInstanceProfileInfo
func nvmlDeviceGetGpuInstanceProfileInfo(device unsafe.Pointer, profileEnum C.uint, info unsafe.Pointer) C.int {
	_, _, t, r := gpuDevice("nvmlDeviceGetGpuInstanceProfileInfo", device)
	if r != nvml.SUCCESS {
		return rc(r)
	}
	profile, r := profileByEnum(t, profileEnum)
	if r != nvml.SUCCESS {
		return rc(r)
	}
	*(*nvml.GpuInstanceProfileInfo)(info) = profile.Info
	return rc(nvml.SUCCESS)
}

func fillProfileV(profile *Profile, info unsafe.Pointer) nvml.Return {
	p := profile.Info
	name := "MIG " + profile.Name
	switch version := (*nvml.GpuInstanceProfileInfo_v2)(info).Version; structVersion(version) {
	case 2:
		v2 := nvml.GpuInstanceProfileInfo_v2{Version: version, Id: p.Id, IsP2pSupported: p.IsP2pSupported,
			SliceCount: p.SliceCount, InstanceCount: p.InstanceCount, MultiprocessorCount: p.MultiprocessorCount,
			CopyEngineCount: p.CopyEngineCount, DecoderCount: p.DecoderCount, EncoderCount: p.EncoderCount,
			JpegCount: p.JpegCount, OfaCount: p.OfaCount, MemorySizeMB: p.MemorySizeMB}
		fixed(v2.Name[:], name)
		*(*nvml.GpuInstanceProfileInfo_v2)(info) = v2
	case 3:
		v3 := nvml.GpuInstanceProfileInfo_v3{Version: version, Id: p.Id, SliceCount: p.SliceCount,
			InstanceCount: p.InstanceCount, MultiprocessorCount: p.MultiprocessorCount,
			CopyEngineCount: p.CopyEngineCount, DecoderCount: p.DecoderCount, EncoderCount: p.EncoderCount,
			JpegCount: p.JpegCount, OfaCount: p.OfaCount, MemorySizeMB: p.MemorySizeMB}
		if p.IsP2pSupported != 0 {
			v3.Capabilities = nvml.GPU_INSTANCE_PROFILE_CAPS_P2P
		}
		fixed(v3.Name[:], name)
		*(*nvml.GpuInstanceProfileInfo_v3)(info) = v3
	default:
		return nvml.ERROR_ARGUMENT_VERSION_MISMATCH
	}
	return nvml.SUCCESS
}

// The versioned query: NOT_SUPPORTED "if device doesn't have MIG mode enabled" (nvml.h).
//
//export nvmlDeviceGetGpuInstanceProfileInfoV
func nvmlDeviceGetGpuInstanceProfileInfoV(device unsafe.Pointer, profileEnum C.uint, info unsafe.Pointer) C.int {
	_, _, t, r := gpuDevice("nvmlDeviceGetGpuInstanceProfileInfoV", device)
	if r != nvml.SUCCESS {
		return rc(r)
	}
	profile, r := profileByEnum(t, profileEnum)
	if r != nvml.SUCCESS {
		return rc(r)
	}
	if !migEnabled(t.st) {
		return rc(nvml.ERROR_NOT_SUPPORTED)
	}
	return rc(fillProfileV(profile, info))
}

//export nvmlDeviceGetGpuInstanceProfileInfoByIdV
func nvmlDeviceGetGpuInstanceProfileInfoByIdV(device unsafe.Pointer, id C.uint, info unsafe.Pointer) C.int {
	_, _, t, r := gpuDevice("nvmlDeviceGetGpuInstanceProfileInfoByIdV", device)
	if r != nvml.SUCCESS {
		return rc(r)
	}
	profile, ok := t.gpu.ByID[uint32(id)]
	if !ok || !migEnabled(t.st) {
		return rc(nvml.ERROR_NOT_SUPPORTED)
	}
	return rc(fillProfileV(profile, info))
}

// Placements answer whatever the MIG mode ("regardless of whether MIG is enabled", nvml.h).
//
//export nvmlDeviceGetGpuInstancePossiblePlacements_v2
func nvmlDeviceGetGpuInstancePossiblePlacements_v2(device unsafe.Pointer, id C.uint, placements unsafe.Pointer,
	count *C.uint) C.int {
	_, _, t, r := gpuDevice("nvmlDeviceGetGpuInstancePossiblePlacements_v2", device)
	if r != nvml.SUCCESS {
		return rc(r)
	}
	if count == nil {
		return rc(nvml.ERROR_INVALID_ARGUMENT)
	}
	profile, ok := t.gpu.ByID[uint32(id)]
	if !ok {
		return rc(nvml.ERROR_NOT_SUPPORTED)
	}
	if placements == nil {
		*count = C.uint(len(profile.Placements))
		return rc(nvml.SUCCESS)
	}
	if int(*count) < len(profile.Placements) {
		*count = C.uint(len(profile.Placements))
		return rc(nvml.ERROR_INSUFFICIENT_SIZE)
	}
	copy(unsafe.Slice((*nvml.GpuInstancePlacement)(placements), len(profile.Placements)), profile.Placements)
	*count = C.uint(len(profile.Placements))
	return rc(nvml.SUCCESS)
}

// room is why a GPU instance of profile at placement cannot be made now (SUCCESS: it can).
func room(gpu *GPU, st *GPUState, profile *Profile, at nvml.GpuInstancePlacement) nvml.Return {
	valid := false
	for _, p := range profile.Placements {
		valid = valid || p == at
	}
	if !valid {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	same, ofa, slices := uint32(0), profile.Info.OfaCount, profile.Info.SliceCount
	total := uint32(0)
	for _, p := range gpu.Profiles {
		total = max(total, p.Info.SliceCount)
	}
	for _, gi := range st.Instances {
		if gi.Start < at.Start+at.Size && at.Start < gi.Start+gi.Size {
			return nvml.ERROR_INSUFFICIENT_RESOURCES // its memory slices are taken
		}
		other := gpu.ByID[gi.ProfileID]
		if other == nil {
			continue
		}
		if gi.ProfileID == profile.Info.Id {
			same++
		}
		ofa += other.Info.OfaCount
		slices += other.Info.SliceCount
	}
	if same >= profile.Info.InstanceCount || ofa > gpu.OfaTotal || slices > total {
		return nvml.ERROR_INSUFFICIENT_RESOURCES
	}
	return nvml.SUCCESS
}

//export nvmlDeviceGetGpuInstanceRemainingCapacity
func nvmlDeviceGetGpuInstanceRemainingCapacity(device unsafe.Pointer, id C.uint, count *C.uint) C.int {
	_, _, t, r := gpuDevice("nvmlDeviceGetGpuInstanceRemainingCapacity", device)
	if r != nvml.SUCCESS {
		return rc(r)
	}
	profile, ok := t.gpu.ByID[uint32(id)]
	if !ok || !migEnabled(t.st) {
		return rc(nvml.ERROR_NOT_SUPPORTED)
	}
	free := 0
	for _, at := range profile.Placements {
		if room(t.gpu, t.st, profile, at) == nvml.SUCCESS {
			free++
		}
	}
	*count = C.uint(free)
	return rc(nvml.SUCCESS)
}

func createGpuInstance(call string, device unsafe.Pointer, id C.uint, at *nvml.GpuInstancePlacement,
	instance unsafe.Pointer) C.int {
	node, _, t, r := gpuDevice(call, device)
	if r != nvml.SUCCESS {
		return rc(r)
	}
	if instance == nil {
		return rc(nvml.ERROR_INVALID_ARGUMENT)
	}
	if failure, ok := failed(node, call, t.gpu.Index); ok {
		return rc(failure)
	}
	profile, ok := t.gpu.ByID[uint32(id)]
	if !ok {
		return rc(nvml.ERROR_INVALID_ARGUMENT)
	}
	var made uint32
	r = update(node, func(s *State) nvml.Return {
		st := s.gpu(node, t.gpu.Index)
		if st.Lost {
			return nvml.ERROR_GPU_IS_LOST
		}
		if !migEnabled(st) {
			return nvml.ERROR_NOT_SUPPORTED
		}
		chosen := at
		if chosen == nil { // the first placement with room, as NVML picks one
			why := nvml.Return(nvml.ERROR_INSUFFICIENT_RESOURCES)
			for i := range profile.Placements {
				if why = room(t.gpu, st, profile, profile.Placements[i]); why == nvml.SUCCESS {
					chosen = &profile.Placements[i]
					break
				}
			}
			if chosen == nil {
				return why
			}
		} else if why := room(t.gpu, st, profile, *chosen); why != nvml.SUCCESS {
			return why
		}
		made = giID(chosen.Start, chosen.Size)
		for taken(st, made) {
			made++
		}
		st.Instances = append(st.Instances, GpuInstance{ID: made, ProfileID: profile.Info.Id, Start: chosen.Start,
			Size: chosen.Size, Computes: []ComputeInstance{}})
		sort.Slice(st.Instances, func(i, j int) bool { return st.Instances[i].ID < st.Instances[j].ID })
		return nvml.SUCCESS
	})
	if r != nvml.SUCCESS {
		return rc(r)
	}
	out(instance, handleOf(ref{kind: kindGpuInstance, gpu: t.gpu.Index, gi: made}))
	return rc(nvml.SUCCESS)
}

func taken(st *GPUState, id uint32) bool {
	for _, gi := range st.Instances {
		if gi.ID == id {
			return true
		}
	}
	return false
}

//export nvmlDeviceCreateGpuInstance
func nvmlDeviceCreateGpuInstance(device unsafe.Pointer, id C.uint, instance unsafe.Pointer) C.int {
	return createGpuInstance("nvmlDeviceCreateGpuInstance", device, id, nil, instance)
}

//export nvmlDeviceCreateGpuInstanceWithPlacement
func nvmlDeviceCreateGpuInstanceWithPlacement(device unsafe.Pointer, id C.uint, placement unsafe.Pointer,
	instance unsafe.Pointer) C.int {
	if placement == nil {
		trace("nvmlDeviceCreateGpuInstanceWithPlacement")
		return rc(nvml.ERROR_INVALID_ARGUMENT)
	}
	at := *(*nvml.GpuInstancePlacement)(placement)
	return createGpuInstance("nvmlDeviceCreateGpuInstanceWithPlacement", device, id, &at, instance)
}

//export nvmlDeviceGetGpuInstances
func nvmlDeviceGetGpuInstances(device unsafe.Pointer, id C.uint, instances unsafe.Pointer, count *C.uint) C.int {
	_, _, t, r := gpuDevice("nvmlDeviceGetGpuInstances", device)
	if r != nvml.SUCCESS {
		return rc(r)
	}
	if count == nil || instances == nil {
		return rc(nvml.ERROR_INVALID_ARGUMENT)
	}
	if _, ok := t.gpu.ByID[uint32(id)]; !ok {
		return rc(nvml.ERROR_INVALID_ARGUMENT)
	}
	if !migEnabled(t.st) {
		return rc(nvml.ERROR_NOT_SUPPORTED)
	}
	var found []unsafe.Pointer
	for _, gi := range t.st.Instances {
		if gi.ProfileID == uint32(id) {
			found = append(found, handleOf(ref{kind: kindGpuInstance, gpu: t.gpu.Index, gi: gi.ID}))
		}
	}
	if int(*count) < len(found) {
		*count = C.uint(len(found))
		return rc(nvml.ERROR_INSUFFICIENT_SIZE)
	}
	copy(unsafe.Slice((*unsafe.Pointer)(instances), len(found)), found)
	*count = C.uint(len(found))
	return rc(nvml.SUCCESS)
}

//export nvmlDeviceGetGpuInstanceById
func nvmlDeviceGetGpuInstanceById(device unsafe.Pointer, id C.uint, instance unsafe.Pointer) C.int {
	_, _, t, r := gpuDevice("nvmlDeviceGetGpuInstanceById", device)
	if r != nvml.SUCCESS {
		return rc(r)
	}
	if instance == nil {
		return rc(nvml.ERROR_INVALID_ARGUMENT)
	}
	if !migEnabled(t.st) {
		return rc(nvml.ERROR_NOT_SUPPORTED)
	}
	if !taken(t.st, uint32(id)) {
		return rc(nvml.ERROR_NOT_FOUND)
	}
	out(instance, handleOf(ref{kind: kindGpuInstance, gpu: t.gpu.Index, gi: uint32(id)}))
	return rc(nvml.SUCCESS)
}

func gpuInstance(call string, handle unsafe.Pointer) (*Node, target, nvml.Return) {
	node, state, r := begin(call)
	if r != nvml.SUCCESS {
		return nil, target{}, r
	}
	t, r := resolve(node, state, handle, kindGpuInstance)
	return node, t, r
}

//export nvmlGpuInstanceGetInfo
func nvmlGpuInstanceGetInfo(instance unsafe.Pointer, info unsafe.Pointer) C.int {
	_, t, r := gpuInstance("nvmlGpuInstanceGetInfo", instance)
	if r != nvml.SUCCESS {
		return rc(r)
	}
	device := handleOf(ref{kind: kindDevice, gpu: t.gpu.Index})
	*(*giInfo)(info) = giInfo{Device: uintptr(device), ID: t.gi.ID, ProfileID: t.gi.ProfileID, Start: t.gi.Start,
		Size: t.gi.Size}
	return rc(nvml.SUCCESS)
}

// IN_USE while it has compute instances or processes (nvml.h).
//
//export nvmlGpuInstanceDestroy
func nvmlGpuInstanceDestroy(instance unsafe.Pointer) C.int {
	node, t, r := gpuInstance("nvmlGpuInstanceDestroy", instance)
	if r != nvml.SUCCESS {
		return rc(r)
	}
	if failure, ok := failed(node, "nvmlGpuInstanceDestroy", t.gpu.Index); ok {
		return rc(failure)
	}
	return rc(update(node, func(s *State) nvml.Return {
		st := s.gpu(node, t.gpu.Index)
		for i, gi := range st.Instances {
			if gi.ID != t.gi.ID {
				continue
			}
			if len(gi.Computes) > 0 {
				return nvml.ERROR_IN_USE
			}
			st.Instances = append(st.Instances[:i], st.Instances[i+1:]...)
			return nvml.SUCCESS
		}
		return nvml.ERROR_INVALID_ARGUMENT
	}))
}

func ciProfile(t target, profileEnum C.uint, engine C.uint) (nvml.ComputeInstanceProfileInfo, nvml.Return) {
	if int(profileEnum) >= nvml.COMPUTE_INSTANCE_PROFILE_COUNT {
		return nvml.ComputeInstanceProfileInfo{}, nvml.ERROR_INVALID_ARGUMENT
	}
	if engine != nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED || t.prof == nil {
		return nvml.ComputeInstanceProfileInfo{}, nvml.ERROR_NOT_SUPPORTED
	}
	info, ok := t.prof.CI[int(profileEnum)]
	if !ok {
		return nvml.ComputeInstanceProfileInfo{}, nvml.ERROR_NOT_SUPPORTED
	}
	return info, nvml.SUCCESS
}

//export nvmlGpuInstanceGetComputeInstanceProfileInfo
func nvmlGpuInstanceGetComputeInstanceProfileInfo(instance unsafe.Pointer, profileEnum C.uint, engine C.uint,
	info unsafe.Pointer) C.int {
	_, t, r := gpuInstance("nvmlGpuInstanceGetComputeInstanceProfileInfo", instance)
	if r != nvml.SUCCESS {
		return rc(r)
	}
	found, r := ciProfile(t, profileEnum, engine)
	if r != nvml.SUCCESS {
		return rc(r)
	}
	*(*nvml.ComputeInstanceProfileInfo)(info) = found
	return rc(nvml.SUCCESS)
}

//export nvmlGpuInstanceGetComputeInstanceProfileInfoV
func nvmlGpuInstanceGetComputeInstanceProfileInfoV(instance unsafe.Pointer, profileEnum C.uint, engine C.uint,
	info unsafe.Pointer) C.int {
	_, t, r := gpuInstance("nvmlGpuInstanceGetComputeInstanceProfileInfoV", instance)
	if r != nvml.SUCCESS {
		return rc(r)
	}
	p, r := ciProfile(t, profileEnum, engine)
	if r != nvml.SUCCESS {
		return rc(r)
	}
	name := fmt.Sprintf("MIG %dc.%s", p.SliceCount, t.prof.Name)
	if p.SliceCount == t.prof.Info.SliceCount {
		name = "MIG " + t.prof.Name
	}
	switch version := (*nvml.ComputeInstanceProfileInfo_v2)(info).Version; structVersion(version) {
	case 2:
		v2 := nvml.ComputeInstanceProfileInfo_v2{Version: version, Id: p.Id, SliceCount: p.SliceCount,
			InstanceCount: p.InstanceCount, MultiprocessorCount: p.MultiprocessorCount,
			SharedCopyEngineCount: p.SharedCopyEngineCount, SharedDecoderCount: p.SharedDecoderCount,
			SharedEncoderCount: p.SharedEncoderCount, SharedJpegCount: p.SharedJpegCount,
			SharedOfaCount: p.SharedOfaCount}
		fixed(v2.Name[:], name)
		*(*nvml.ComputeInstanceProfileInfo_v2)(info) = v2
	case 3:
		v3 := nvml.ComputeInstanceProfileInfo_v3{Version: version, Id: p.Id, SliceCount: p.SliceCount,
			InstanceCount: p.InstanceCount, MultiprocessorCount: p.MultiprocessorCount,
			SharedCopyEngineCount: p.SharedCopyEngineCount, SharedDecoderCount: p.SharedDecoderCount,
			SharedEncoderCount: p.SharedEncoderCount, SharedJpegCount: p.SharedJpegCount,
			SharedOfaCount: p.SharedOfaCount}
		fixed(v3.Name[:], name)
		*(*nvml.ComputeInstanceProfileInfo_v3)(info) = v3
	default:
		return rc(nvml.ERROR_ARGUMENT_VERSION_MISMATCH)
	}
	return rc(nvml.SUCCESS)
}

//export nvmlGpuInstanceGetComputeInstancePossiblePlacements
func nvmlGpuInstanceGetComputeInstancePossiblePlacements(instance unsafe.Pointer, id C.uint,
	placements unsafe.Pointer, count *C.uint) C.int {
	_, t, r := gpuInstance("nvmlGpuInstanceGetComputeInstancePossiblePlacements", instance)
	if r != nvml.SUCCESS {
		return rc(r)
	}
	found, ok := t.prof.CIPlacements[int(id)]
	if !ok || count == nil {
		return rc(nvml.ERROR_NOT_SUPPORTED)
	}
	if placements == nil || int(*count) < len(found) {
		*count = C.uint(len(found))
		if placements == nil {
			return rc(nvml.SUCCESS)
		}
		return rc(nvml.ERROR_INSUFFICIENT_SIZE)
	}
	copy(unsafe.Slice((*nvml.ComputeInstancePlacement)(placements), len(found)), found)
	*count = C.uint(len(found))
	return rc(nvml.SUCCESS)
}

func ciRoom(t target, gi *GpuInstance, id int, at nvml.ComputeInstancePlacement) nvml.Return {
	info, ok := t.prof.CI[id]
	if !ok {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	valid := false
	for _, p := range t.prof.CIPlacements[id] {
		valid = valid || p == at
	}
	if !valid {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	same := uint32(0)
	for _, ci := range gi.Computes {
		if ci.Start < at.Start+at.Size && at.Start < ci.Start+ci.Size {
			return nvml.ERROR_INSUFFICIENT_RESOURCES
		}
		if ci.ProfileID == uint32(id) {
			same++
		}
	}
	if same >= info.InstanceCount {
		return nvml.ERROR_INSUFFICIENT_RESOURCES
	}
	return nvml.SUCCESS
}

func createComputeInstance(call string, instance unsafe.Pointer, id C.uint, at *nvml.ComputeInstancePlacement,
	compute unsafe.Pointer) C.int {
	node, t, r := gpuInstance(call, instance)
	if r != nvml.SUCCESS {
		return rc(r)
	}
	if compute == nil {
		return rc(nvml.ERROR_INVALID_ARGUMENT)
	}
	if failure, ok := failed(node, call, t.gpu.Index); ok {
		return rc(failure)
	}
	var made uint32
	r = update(node, func(s *State) nvml.Return {
		st := s.gpu(node, t.gpu.Index)
		var gi *GpuInstance
		for i := range st.Instances {
			if st.Instances[i].ID == t.gi.ID {
				gi = &st.Instances[i]
			}
		}
		if gi == nil {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		chosen := at
		if chosen == nil {
			why := nvml.Return(nvml.ERROR_INSUFFICIENT_RESOURCES)
			options := t.prof.CIPlacements[int(id)]
			if len(options) == 0 {
				why = nvml.ERROR_INVALID_ARGUMENT
			}
			for i := range options {
				if why = ciRoom(t, gi, int(id), options[i]); why == nvml.SUCCESS {
					chosen = &options[i]
					break
				}
			}
			if chosen == nil {
				return why
			}
		} else if why := ciRoom(t, gi, int(id), *chosen); why != nvml.SUCCESS {
			return why
		}
		for made = 0; ciTaken(gi, made); made++ {
		}
		s.Serial++
		uuid := uuidOf("MIG", fmt.Sprintf("%s/%d", t.gpu.UUID, s.Serial))
		gi.Computes = append(gi.Computes, ComputeInstance{ID: made, ProfileID: uint32(id), Start: chosen.Start,
			Size: chosen.Size, UUID: uuid})
		sort.Slice(gi.Computes, func(i, j int) bool { return gi.Computes[i].ID < gi.Computes[j].ID })
		return nvml.SUCCESS
	})
	if r != nvml.SUCCESS {
		return rc(r)
	}
	out(compute, handleOf(ref{kind: kindComputeInstance, gpu: t.gpu.Index, gi: t.gi.ID, ci: made}))
	return rc(nvml.SUCCESS)
}

func ciTaken(gi *GpuInstance, id uint32) bool {
	for _, ci := range gi.Computes {
		if ci.ID == id {
			return true
		}
	}
	return false
}

//export nvmlGpuInstanceCreateComputeInstance
func nvmlGpuInstanceCreateComputeInstance(instance unsafe.Pointer, id C.uint, compute unsafe.Pointer) C.int {
	return createComputeInstance("nvmlGpuInstanceCreateComputeInstance", instance, id, nil, compute)
}

//export nvmlGpuInstanceCreateComputeInstanceWithPlacement
func nvmlGpuInstanceCreateComputeInstanceWithPlacement(instance unsafe.Pointer, id C.uint, placement unsafe.Pointer,
	compute unsafe.Pointer) C.int {
	if placement == nil {
		trace("nvmlGpuInstanceCreateComputeInstanceWithPlacement")
		return rc(nvml.ERROR_INVALID_ARGUMENT)
	}
	at := *(*nvml.ComputeInstancePlacement)(placement)
	return createComputeInstance("nvmlGpuInstanceCreateComputeInstanceWithPlacement", instance, id, &at, compute)
}

//export nvmlGpuInstanceGetComputeInstances
func nvmlGpuInstanceGetComputeInstances(instance unsafe.Pointer, id C.uint, computes unsafe.Pointer,
	count *C.uint) C.int {
	_, t, r := gpuInstance("nvmlGpuInstanceGetComputeInstances", instance)
	if r != nvml.SUCCESS {
		return rc(r)
	}
	if count == nil || computes == nil {
		return rc(nvml.ERROR_INVALID_ARGUMENT)
	}
	var found []unsafe.Pointer
	for _, ci := range t.gi.Computes {
		if ci.ProfileID == uint32(id) {
			found = append(found, handleOf(ref{kind: kindComputeInstance, gpu: t.gpu.Index, gi: t.gi.ID, ci: ci.ID}))
		}
	}
	if int(*count) < len(found) {
		*count = C.uint(len(found))
		return rc(nvml.ERROR_INSUFFICIENT_SIZE)
	}
	copy(unsafe.Slice((*unsafe.Pointer)(computes), len(found)), found)
	*count = C.uint(len(found))
	return rc(nvml.SUCCESS)
}

//export nvmlGpuInstanceGetComputeInstanceById
func nvmlGpuInstanceGetComputeInstanceById(instance unsafe.Pointer, id C.uint, compute unsafe.Pointer) C.int {
	_, t, r := gpuInstance("nvmlGpuInstanceGetComputeInstanceById", instance)
	if r != nvml.SUCCESS {
		return rc(r)
	}
	if compute == nil {
		return rc(nvml.ERROR_INVALID_ARGUMENT)
	}
	if !ciTaken(t.gi, uint32(id)) {
		return rc(nvml.ERROR_NOT_FOUND)
	}
	out(compute, handleOf(ref{kind: kindComputeInstance, gpu: t.gpu.Index, gi: t.gi.ID, ci: uint32(id)}))
	return rc(nvml.SUCCESS)
}

//export nvmlGpuInstanceGetComputeInstanceRemainingCapacity
func nvmlGpuInstanceGetComputeInstanceRemainingCapacity(instance unsafe.Pointer, id C.uint, count *C.uint) C.int {
	_, t, r := gpuInstance("nvmlGpuInstanceGetComputeInstanceRemainingCapacity", instance)
	if r != nvml.SUCCESS {
		return rc(r)
	}
	free := 0
	for _, at := range t.prof.CIPlacements[int(id)] {
		if ciRoom(t, t.gi, int(id), at) == nvml.SUCCESS {
			free++
		}
	}
	*count = C.uint(free)
	return rc(nvml.SUCCESS)
}

func computeInstance(call string, handle unsafe.Pointer) (*Node, target, nvml.Return) {
	node, state, r := begin(call)
	if r != nvml.SUCCESS {
		return nil, target{}, r
	}
	t, r := resolve(node, state, handle, kindComputeInstance)
	return node, t, r
}

//export nvmlComputeInstanceGetInfo_v2
func nvmlComputeInstanceGetInfo_v2(compute unsafe.Pointer, info unsafe.Pointer) C.int {
	_, t, r := computeInstance("nvmlComputeInstanceGetInfo_v2", compute)
	if r != nvml.SUCCESS {
		return rc(r)
	}
	device := handleOf(ref{kind: kindDevice, gpu: t.gpu.Index})
	instance := handleOf(ref{kind: kindGpuInstance, gpu: t.gpu.Index, gi: t.gi.ID})
	*(*ciInfo)(info) = ciInfo{Device: uintptr(device), GpuInstance: uintptr(instance), ID: t.ci.ID,
		ProfileID: t.ci.ProfileID, Start: t.ci.Start, Size: t.ci.Size}
	return rc(nvml.SUCCESS)
}

//export nvmlComputeInstanceGetInfo
func nvmlComputeInstanceGetInfo(compute unsafe.Pointer, info unsafe.Pointer) C.int {
	return nvmlComputeInstanceGetInfo_v2(compute, info)
}

// IN_USE while processes run on it (nvml.h).
//
//export nvmlComputeInstanceDestroy
func nvmlComputeInstanceDestroy(compute unsafe.Pointer) C.int {
	node, t, r := computeInstance("nvmlComputeInstanceDestroy", compute)
	if r != nvml.SUCCESS {
		return rc(r)
	}
	if failure, ok := failed(node, "nvmlComputeInstanceDestroy", t.gpu.Index); ok {
		return rc(failure)
	}
	return rc(update(node, func(s *State) nvml.Return {
		st := s.gpu(node, t.gpu.Index)
		for _, p := range st.Processes {
			if p.MigUUID == t.ci.UUID {
				return nvml.ERROR_IN_USE
			}
		}
		for i := range st.Instances {
			gi := &st.Instances[i]
			if gi.ID != t.gi.ID {
				continue
			}
			for j, ci := range gi.Computes {
				if ci.ID == t.ci.ID {
					gi.Computes = append(gi.Computes[:j], gi.Computes[j+1:]...)
					return nvml.SUCCESS
				}
			}
		}
		return nvml.ERROR_INVALID_ARGUMENT
	}))
}

// MIG devices: one per compute instance, in GPU instance then compute instance order.

type migDevice struct {
	gi GpuInstance
	ci ComputeInstance
}

func migDevices(st *GPUState) []migDevice {
	var found []migDevice
	for _, gi := range st.Instances {
		for _, ci := range gi.Computes {
			found = append(found, migDevice{gi, ci})
		}
	}
	return found
}

//export nvmlDeviceGetMaxMigDeviceCount
func nvmlDeviceGetMaxMigDeviceCount(device unsafe.Pointer, count *C.uint) C.int {
	_, _, t, r := gpuDevice("nvmlDeviceGetMaxMigDeviceCount", device)
	if r != nvml.SUCCESS {
		return rc(r)
	}
	// "Returns zero if MIG is not supported or enabled" (nvml.h).
	most := uint32(0)
	for _, p := range t.gpu.Profiles {
		if migEnabled(t.st) {
			most = max(most, p.Info.InstanceCount)
		}
	}
	*count = C.uint(most)
	return rc(nvml.SUCCESS)
}

//export nvmlDeviceGetMigDeviceHandleByIndex
func nvmlDeviceGetMigDeviceHandleByIndex(device unsafe.Pointer, index C.uint, mig unsafe.Pointer) C.int {
	_, _, t, r := gpuDevice("nvmlDeviceGetMigDeviceHandleByIndex", device)
	if r != nvml.SUCCESS {
		return rc(r)
	}
	if mig == nil {
		return rc(nvml.ERROR_INVALID_ARGUMENT)
	}
	found := migDevices(t.st)
	if int(index) >= len(found) {
		return rc(nvml.ERROR_NOT_FOUND)
	}
	d := found[index]
	out(mig, handleOf(ref{kind: kindMig, gpu: t.gpu.Index, gi: d.gi.ID, ci: d.ci.ID}))
	return rc(nvml.SUCCESS)
}

//export nvmlDeviceIsMigDeviceHandle
func nvmlDeviceIsMigDeviceHandle(device unsafe.Pointer, isMig *C.uint) C.int {
	_, t, r := anyDevice("nvmlDeviceIsMigDeviceHandle", device)
	if r != nvml.SUCCESS {
		return rc(r)
	}
	*isMig = 0
	if t.isMig() {
		*isMig = 1
	}
	return rc(nvml.SUCCESS)
}

func migOnly(call string, handle unsafe.Pointer) (target, nvml.Return) {
	node, state, r := begin(call)
	if r != nvml.SUCCESS {
		return target{}, r
	}
	t, r := resolve(node, state, handle, kindDevice, kindMig)
	if r == nvml.SUCCESS && !t.isMig() {
		r = nvml.ERROR_INVALID_ARGUMENT
	}
	return t, r
}

//export nvmlDeviceGetGpuInstanceId
func nvmlDeviceGetGpuInstanceId(device unsafe.Pointer, id *C.uint) C.int {
	t, r := migOnly("nvmlDeviceGetGpuInstanceId", device)
	if r != nvml.SUCCESS {
		return rc(r)
	}
	*id = C.uint(t.gi.ID)
	return rc(nvml.SUCCESS)
}

//export nvmlDeviceGetComputeInstanceId
func nvmlDeviceGetComputeInstanceId(device unsafe.Pointer, id *C.uint) C.int {
	t, r := migOnly("nvmlDeviceGetComputeInstanceId", device)
	if r != nvml.SUCCESS {
		return rc(r)
	}
	*id = C.uint(t.ci.ID)
	return rc(nvml.SUCCESS)
}

//export nvmlDeviceGetDeviceHandleFromMigDeviceHandle
func nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig unsafe.Pointer, device unsafe.Pointer) C.int {
	t, r := migOnly("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", mig)
	if r != nvml.SUCCESS {
		return rc(r)
	}
	out(device, handleOf(ref{kind: kindDevice, gpu: t.gpu.Index}))
	return rc(nvml.SUCCESS)
}

// A MIG device's share of its GPU (go-nvlib's MigDevice.GetProfile reads it).
//
//export nvmlDeviceGetAttributes_v2
func nvmlDeviceGetAttributes_v2(device unsafe.Pointer, attributes unsafe.Pointer) C.int {
	t, r := migOnly("nvmlDeviceGetAttributes_v2", device)
	if r == nvml.ERROR_INVALID_ARGUMENT && t.gpu == nil {
		return rc(r)
	}
	if r != nvml.SUCCESS {
		return rc(nvml.ERROR_NOT_SUPPORTED)
	}
	ci := t.prof.CI[int(t.ci.ProfileID)]
	*(*nvml.DeviceAttributes)(attributes) = nvml.DeviceAttributes{
		MultiprocessorCount:       ci.MultiprocessorCount,
		SharedCopyEngineCount:     t.prof.Info.CopyEngineCount,
		SharedDecoderCount:        t.prof.Info.DecoderCount,
		SharedEncoderCount:        t.prof.Info.EncoderCount,
		SharedJpegCount:           t.prof.Info.JpegCount,
		SharedOfaCount:            t.prof.Info.OfaCount,
		GpuInstanceSliceCount:     t.prof.Info.SliceCount,
		ComputeInstanceSliceCount: ci.SliceCount,
		MemorySizeMB:              t.prof.Info.MemorySizeMB,
	}
	return rc(nvml.SUCCESS)
}

//export nvmlDeviceGetAttributes
func nvmlDeviceGetAttributes(device unsafe.Pointer, attributes unsafe.Pointer) C.int {
	return nvmlDeviceGetAttributes_v2(device, attributes)
}
