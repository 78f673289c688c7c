"""What the bench publishes and what its pods ask for, per way of serving GPUs (pure).

A ``Layout`` is a set of GpuSlicePolicies (or, for the device plugin's view, one
whole-GPU device per GPU of a driver of the bench's own) and the claim a pod with a
given memory need makes. The mapping of a need to a request is part of the design:

- ``whole``: one whole GPU, whatever the need (what a device plugin's ``nvidia.com/gpu: 1``
  gives);
- ``mig``: the smallest MIG profile of the layout that holds the need, then each larger one,
  as a prioritized list (``firstAvailable``, KEP-4816);
- ``memory``: the smallest slice class that holds the need, then each larger one, as a
  prioritized list; several slices of one class per pod are not used, because the
  allocator's search for N devices with one ``matchAttribute`` enumerates combinations of a
  GPU's free slices, which is exponential when the pod does not fit;
- ``shared``: the need rounded up to the policy's step, as a capacity request.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuslice.dra.names import ATTRIBUTE_DOMAIN, device_class_name
from gpuslice.dra.quantity import quantity_bytes
from gpuslice.inventory.catalog import MODELS
from gpuslice.jsontypes import Object
from gpuslice.planning.kinds import profile_tag

GIB = 1024**3
# Not under gpuslice.dev: a DeviceClass named *.gpuslice.dev is gpuslice's, and its admission rules
# judge (and outside a tenant's namespace refuse) every claim of one.
WHOLE_DRIVER = "whole-gpu.bench.example.com"
WHOLE_CLASS = "whole-gpu.bench.example.com"
H100 = MODELS["h100-80gb"]


@dataclass(frozen=True)
class Choice:
    """One way a request can be met: a device class, a CEL selector, and a capacity request."""

    device_class: str
    selector: str | None = None
    memory: int | None = None  # bytes of consumable capacity (shared mode)
    gives: int = 0  # bytes of GPU memory the device holds for the pod


@dataclass(frozen=True)
class Layout:
    name: str
    title: str
    policies: tuple[Object, ...] = ()
    whole_gpu: bool = False
    # The choices for a pod needing ``need`` GiB, first preferred; empty: it cannot be served.
    choices: Callable[[int], tuple[Choice, ...]] = field(default=lambda _: ())
    capacity_per_gpu: int = 1  # pods of the scheduler-cost claim one GPU holds

    def claim(self, namespace: str, name: str, need_gib: int) -> Object | None:
        return claim_body(namespace, name, self.choices(need_gib))


def mig_class(policy_name: str, profile: str) -> str:
    """The DeviceClass of one MIG profile of a policy (``planning.kinds``: a class per kind)."""
    return f"{profile_tag(profile)}.{device_class_name(policy_name)}"


def _attr(name: str) -> str:
    return f'device.attributes["{ATTRIBUTE_DOMAIN}"].{name}'


def claim_body(namespace: str, name: str, choices: Sequence[Choice]) -> Object | None:
    if not choices:
        return None

    def exactly(choice: Choice) -> dict[str, Any]:
        request: dict[str, Any] = {"deviceClassName": choice.device_class, "allocationMode": "ExactCount",
                                   "count": 1}
        if choice.selector:
            request["selectors"] = [{"cel": {"expression": choice.selector}}]
        if choice.memory is not None:
            request["capacity"] = {"requests": {"memory": str(choice.memory)}}
        return request

    request: dict[str, Any]
    if len(choices) == 1:
        request = {"name": "gpu", "exactly": exactly(choices[0])}
    else:
        request = {"name": "gpu", "firstAvailable": [{"name": f"c{i}", **exactly(c)} for i, c in enumerate(choices)]}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace}, "spec": {"devices": {"requests": [request]}}}


def policy(name: str, slicing: Mapping[str, Any], tenants: Sequence[str], max_memory: str | None = None) -> Object:
    limit = {"maxMemory": max_memory} if max_memory else {}
    return {"apiVersion": "gpuslice.dev/v1alpha1", "kind": "GpuSlicePolicy", "metadata": {"name": name},
            "spec": {"slicing": dict(slicing), "tenants": [{"namespace": t, **limit} for t in tenants],
                     "claimTemplateName": f"{name}-slice"}}


def whole_gpu_class() -> Object:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": WHOLE_CLASS},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{WHOLE_DRIVER}"'}}]}}


def whole_gpu_slice(node: str, node_uid: str, gpus: int) -> Object:
    """One device per GPU (no counters, no sharing): what a device plugin's ``nvidia.com/gpu``
    is, with the attributes NVIDIA's DRA driver publishes for a whole GPU, so the scheduler
    reads as much per device as it would for the real thing."""
    devices = [{"name": f"gpu-{i}", "attributes": {
        "type": {"string": "gpu"}, "uuid": {"string": f"GPU-bench-{node}-{i}"},
        "productName": {"string": H100.product_name}, "brand": {"string": "Nvidia"},
        "architecture": {"string": "Hopper"}, "cudaComputeCapability": {"version": "9.0.0"},
        "driverVersion": {"version": "580.95.5"}, "cudaDriverVersion": {"version": "13.0.0"},
        "resource.kubernetes.io/pciBusID": {"string": f"0000:{0x18 + 0x10 * i:02x}:00.0"},
        "resource.kubernetes.io/pcieRoot": {"string": f"pci0000:{0x17 + 0x10 * i:02x}"}},
        "capacity": {"memory": {"value": str(H100.memory)}}} for i in range(gpus)]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"bench-whole-{node}",
                         "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid}]},
            "spec": {"driver": WHOLE_DRIVER, "nodeName": node,
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}, "devices": devices}}


def _whole(_: int) -> tuple[Choice, ...]:
    return (Choice(WHOLE_CLASS, gives=H100.memory),)


def whole_layout() -> Layout:
    return Layout("whole", "whole GPU (device plugin)", whole_gpu=True, choices=_whole, capacity_per_gpu=1)


# ---- the packing figure: four ways of serving one trace -------------------------------------

MIG_LAYOUT = {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}  # mig-parted's "all-balanced" for H100 80GB
MEMORY_CLASSES = ("5Gi", "10Gi", "20Gi", "40Gi")  # a doubling ladder, as MIG's sizes
SHARED_STEP = "1Gi"


def mig_static_layout(tenants: Sequence[str]) -> Layout:
    name = "bench-mig"
    profiles = sorted((H100.mig_profile(p) for p in MIG_LAYOUT), key=lambda p: p.memory if p else 0)

    def choices(need: int) -> tuple[Choice, ...]:
        return tuple(Choice(mig_class(name, p.name), gives=p.memory)
                     for p in profiles if p is not None and p.memory >= need * GIB)

    return Layout("mig-static", "static MIG (2x1g.10gb+2g.20gb+3g.40gb)",
                  (policy(name, {"mode": "mig", "mig": {"layout": dict(MIG_LAYOUT)}}, tenants),), choices=choices)


def memory_ladder_layout(tenants: Sequence[str]) -> Layout:
    names = {size: f"bench-mem-{size.lower()}" for size in MEMORY_CLASSES}

    def choices(need: int) -> tuple[Choice, ...]:
        return tuple(Choice(device_class_name(names[s]), f'{_attr("sliceSize")} == "{s}"', gives=quantity_bytes(s))
                     for s in MEMORY_CLASSES if quantity_bytes(s) >= need * GIB)

    return Layout("memory", f"memory slices ({'/'.join(MEMORY_CLASSES)})",
                  tuple(policy(n, {"mode": "memory", "sliceSize": s}, tenants) for s, n in names.items()),
                  choices=choices)


def shared_layout(tenants: Sequence[str], step: str = SHARED_STEP, name: str = "bench-shared",
                  max_memory: str | None = None) -> Layout:
    """Shared capacity; with ``max_memory``, every tenant limited to that much (the webhook charges it)."""
    step_bytes = quantity_bytes(step)

    def choices(need: int) -> tuple[Choice, ...]:
        memory = math.ceil(need * GIB / step_bytes) * step_bytes
        return (Choice(device_class_name(name), memory=memory, gives=memory),) if memory <= H100.memory else ()

    if max_memory:
        return Layout("shared-limited", f"shared, {len(tenants)} tenants with maxMemory {max_memory}",
                      (policy(name, {"mode": "shared", "sliceSize": step}, tenants, max_memory),), choices=choices,
                      capacity_per_gpu=H100.memory // step_bytes)
    return Layout("shared", f"shared capacity (step {step})",
                  (policy(name, {"mode": "shared", "sliceSize": step}, tenants),), choices=choices,
                  capacity_per_gpu=H100.memory // step_bytes)


def fleet_share(gpus: int, tenants: int) -> str:
    """Each of ``tenants`` gets an equal part of ``gpus`` H100s' memory, so the parts sum to the fleet's."""
    return f"{gpus * H100.memory // tenants // 1024**2}Mi"


def packing_layouts(tenants: Sequence[str]) -> list[Layout]:
    return [whole_layout(), mig_static_layout(tenants), memory_ladder_layout(tenants), shared_layout(tenants)]


# ---- the scheduler-cost figure: one claim size, several layouts ------------------------------

def cost_layouts(tenants: Sequence[str]) -> list[Layout]:
    """Every pod claims 10G (10^10 bytes): eight per H100 in memory and shared mode, seven 1g.10gb MIG."""
    ten = quantity_bytes("10G")

    def slice_of(policy_name: str, size: str) -> Callable[[int], tuple[Choice, ...]]:
        return lambda _: (Choice(device_class_name(policy_name), f'{_attr("sliceSize")} == "{size}"', gives=ten),)

    mig_name = "bench-dmig"
    return [
        whole_layout(),
        Layout("memory-1", "memory, one size (8 x 10G per GPU)",
               (policy("bench-m10", {"mode": "memory", "sliceSize": "10G"}, tenants),),
               choices=slice_of("bench-m10", "10G"), capacity_per_gpu=8),
        Layout("memory-3", "memory, three sizes (10G + 20G + whole GPU: 13 devices per GPU)",
               (policy("bench-m10f", {"mode": "memory", "sliceSize": "10G", "allowFullGpu": True}, tenants),
                policy("bench-m20", {"mode": "memory", "sliceSize": "20G"}, tenants)),
               choices=slice_of("bench-m10f", "10G"), capacity_per_gpu=8),
        Layout("shared", "shared, one consumable device per GPU (step 10G)",
               (policy("bench-s10", {"mode": "shared", "sliceSize": "10G"}, tenants),),
               choices=lambda _: (Choice(device_class_name("bench-s10"), memory=ten, gives=ten),), capacity_per_gpu=8),
        Layout("mig-dynamic", "dynamic MIG (1g.10gb, 2g.20gb, 3g.40gb, 7g.80gb: 13 placements per GPU)",
               (policy(mig_name, {"mode": "mig", "mig": {"profiles": ["1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb"]}},
                       tenants),),
               choices=lambda _: (Choice(mig_class(mig_name, "1g.10gb"), gives=9984 * 1024**2),),
               capacity_per_gpu=7),
    ]
