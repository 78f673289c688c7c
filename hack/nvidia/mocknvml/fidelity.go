// What go-nvml's mocks leave schematic, set as NVML answers on hardware: profile ids, placements
// and GPU instance ids of the seven-slice family.

package main

import (
	"fmt"
	"math"
	"sort"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"
)

// What go-nvml's mocks leave schematic, as NVML answers on hardware. The seven-slice family of
// A100, H100, H200 and B200 (`nvidia-smi mig -lgip` and `-lgipp`): each profile's ID (the mocks
// use the enum's value, so a caller mixing the two would pass), and its placements in memory
// slices (the H100, H200 and B200 mocks give 1g.20gb a size of 1 and 3g a size of 3).
var sevenSlice = map[int]struct {
	id     uint32
	size   uint32
	starts []uint32
}{
	nvml.GPU_INSTANCE_PROFILE_1_SLICE:      {19, 1, []uint32{0, 1, 2, 3, 4, 5, 6}},
	nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1: {20, 1, []uint32{0, 1, 2, 3, 4, 5, 6}},
	nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2: {15, 2, []uint32{0, 2, 4, 6}},
	nvml.GPU_INSTANCE_PROFILE_2_SLICE:      {14, 2, []uint32{0, 2, 4}},
	nvml.GPU_INSTANCE_PROFILE_3_SLICE:      {9, 4, []uint32{0, 4}},
	nvml.GPU_INSTANCE_PROFILE_4_SLICE:      {5, 4, []uint32{0}},
	nvml.GPU_INSTANCE_PROFILE_7_SLICE:      {0, 8, []uint32{0}},
}

// go-nvlib's profile name suffix per enum (pkg/nvlib/device/mig_profile.go).
var suffixes = map[int]string{
	nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1:   "+me",
	nvml.GPU_INSTANCE_PROFILE_2_SLICE_REV1:   "+me",
	nvml.GPU_INSTANCE_PROFILE_1_SLICE_GFX:    "+gfx",
	nvml.GPU_INSTANCE_PROFILE_2_SLICE_GFX:    "+gfx",
	nvml.GPU_INSTANCE_PROFILE_3_SLICE_GFX:    "+gfx",
	nvml.GPU_INSTANCE_PROFILE_4_SLICE_GFX:    "+gfx",
	nvml.GPU_INSTANCE_PROFILE_1_SLICE_NO_ME:  "-me",
	nvml.GPU_INSTANCE_PROFILE_2_SLICE_NO_ME:  "-me",
	nvml.GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME: "+me.all",
	nvml.GPU_INSTANCE_PROFILE_2_SLICE_ALL_ME: "+me.all",
}

// Profile is one GPU instance profile of one GPU.
type Profile struct {
	Enum         int
	Info         nvml.GpuInstanceProfileInfo // Info.Id is NVML's profile id
	Placements   []nvml.GpuInstancePlacement
	CI           map[int]nvml.ComputeInstanceProfileInfo // by compute instance profile enum
	CIPlacements map[int][]nvml.ComputeInstancePlacement
	Name         string // 1g.10gb, as NVML names it in the versioned query (after "MIG ")
}

func setProfiles(gpu *GPU, base gpus.Config, overlay []ProfileOverlay) error {
	gpu.Profiles = map[int]*Profile{}
	gpu.ByID = map[uint32]*Profile{}
	tables := base.MIGProfiles
	enums := make([]int, 0, len(tables.GpuInstanceProfiles))
	for enum := range tables.GpuInstanceProfiles {
		enums = append(enums, enum)
	}
	byEnum := map[int]ProfileOverlay{}
	if len(overlay) > 0 {
		enums = enums[:0]
		for _, want := range overlay {
			if _, ok := tables.GpuInstanceProfiles[want.Enum]; !ok {
				return fmt.Errorf("the %s mock has no MIG profile of enum %d", base.Name, want.Enum)
			}
			byEnum[want.Enum] = want
			enums = append(enums, want.Enum)
		}
	}
	sort.Ints(enums)
	_, fullSized := tables.GpuInstanceProfiles[nvml.GPU_INSTANCE_PROFILE_7_SLICE]
	for _, enum := range enums {
		info := tables.GpuInstanceProfiles[enum]
		profile := &Profile{
			Enum:         enum,
			Info:         info,
			Placements:   append([]nvml.GpuInstancePlacement(nil), tables.GpuInstancePlacements[enum]...),
			CI:           map[int]nvml.ComputeInstanceProfileInfo{},
			CIPlacements: map[int][]nvml.ComputeInstancePlacement{},
		}
		if fix, ok := sevenSlice[enum]; ok && fullSized {
			profile.Info.Id = fix.id
			profile.Placements = placements(fix.starts, fix.size)
		}
		if want, ok := byEnum[enum]; ok {
			profile.Info.MemorySizeMB = want.MemoryMiB
			profile.Info.InstanceCount = want.InstanceCount
			profile.Info.MultiprocessorCount = want.Multiprocessors
			profile.Info.CopyEngineCount = want.CopyEngines
			profile.Info.DecoderCount = want.Decoders
			profile.Info.EncoderCount = want.Encoders
			profile.Info.JpegCount = want.JpegEngines
			profile.Info.OfaCount = want.OfaEngines
			if len(want.Starts) > 0 {
				profile.Placements = placements(want.Starts, want.Size)
			}
		}
		for ciEnum, ci := range tables.ComputeInstanceProfiles[enum] {
			// SMs in proportion to the GPU instance's (the mocks give 16 or 18 per slice).
			if info.SliceCount > 0 {
				ci.MultiprocessorCount = profile.Info.MultiprocessorCount * ci.SliceCount / info.SliceCount
			}
			profile.CI[ciEnum] = ci
			profile.CIPlacements[ciEnum] = tables.ComputeInstancePlacements[enum][ciEnum]
			if len(profile.CIPlacements[ciEnum]) == 0 && ci.SliceCount > 0 {
				// The A100 mock lists none: side by side, as NVML places them in a GPU instance.
				for start := uint32(0); start+ci.SliceCount <= info.SliceCount; start += ci.SliceCount {
					profile.CIPlacements[ciEnum] = append(profile.CIPlacements[ciEnum],
						nvml.ComputeInstancePlacement{Start: start, Size: ci.SliceCount})
				}
			}
		}
		profile.Name = fmt.Sprintf("%dg.%dgb%s", profile.Info.SliceCount,
			migMemoryGB(gpu.Memory, profile.Info.MemorySizeMB), suffixes[enum])
		if _, taken := gpu.ByID[profile.Info.Id]; taken {
			return fmt.Errorf("two MIG profiles with id %d", profile.Info.Id)
		}
		gpu.Profiles[enum] = profile
		gpu.ByID[profile.Info.Id] = profile
		gpu.OfaTotal = max(gpu.OfaTotal, profile.Info.OfaCount)
	}
	return nil
}

func placements(starts []uint32, size uint32) []nvml.GpuInstancePlacement {
	found := make([]nvml.GpuInstancePlacement, len(starts))
	for i, start := range starts {
		found[i] = nvml.GpuInstancePlacement{Start: start, Size: size}
	}
	return found
}

// migMemoryGB is go-nvlib's getMigMemorySizeGB: the profile's share of the GPU in eighths,
// rounded up, times the GPU's whole GiB, rounded.
func migMemoryGB(total, profileMiB uint64) uint64 {
	fraction := math.Ceil(float64(profileMiB*1024*1024)/float64(total)*8) / 8
	gib := float64((total + (1 << 30) - 1) / (1 << 30))
	return uint64(math.Round(fraction * gib))
}

// giID is the GPU instance id NVML gives a placement: the memory slices as a binary tree, the whole
// GPU 0, its halves 1 and 2, quarters 3 to 6, eighths 7 to 14 (nvidia-smi mig -lgi on an A100: 7g
// is GPU instance 0, 3g at slice 4 is 2, a 1g at slice 0 is 7).
func giID(start, size uint32) uint32 {
	if size == 0 || 8%size != 0 {
		return 15 + start
	}
	return 8/size - 1 + start/size
}
