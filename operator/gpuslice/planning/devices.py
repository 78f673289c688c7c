"""The device model: what gpuslice publishes, typed, and read back from a published slice.

A planned :class:`Device` renders the exact JSON the agent publishes
(:meth:`Device.manifest`), and :meth:`Device.from_manifest` reads a published
device back, so the kubelet plugin, the controller and the planner agree on
what a device is without sharing anything but the ResourceSlice.

GPUs are named by their UUID, never their index: an index shifts when a GPU
drops off the bus, and a counter set named by index would then guard two
physical GPUs at once (or one GPU twice), letting their memory be handed out
twice. :func:`gpu_tag` is the short, stable form of the UUID used in counter set
and device names.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuslice.api.policy import SlicingModeName
from gpuslice.dra.names import ATTRIBUTE_DOMAIN, PENDING_TAINT_KEY, short_hash
from gpuslice.dra.quantity import format_bytes, parse_quantity, quantity_bytes
from gpuslice.dra.wire import text_attribute
from gpuslice.inventory.catalog import Engines
from gpuslice.inventory.gpus import Gpu
from gpuslice.inventory.pci import PCI_BUS_ID_ATTRIBUTE as PCI_BUS_ID
from gpuslice.planning.attributes import (
    GpuFacts,
    mig_capacities,
    nvidia_attributes,
    read_engines,
    read_facts,
    topology_attributes,
)
from gpuslice.planning.mode_traits import FULL_SLICE_SIZE, MEMORY, ModeTraits, traits_of

Mode = SlicingModeName
_HEX8 = re.compile(r"^[0-9a-f]{8}$")
MIG_UUID = "uuid"  # unqualified: the driver's domain, where NVIDIA's attributes are
NO_FACTS = GpuFacts()


def gpu_tag(uuid: str) -> str:
    """``gpu-2d3e5f1a``: the first eight hex digits of the UUID (what ``nvidia-smi -L`` shows),
    or a hash of it when it has none. A function of the UUID alone, so a GPU keeps its name
    whatever else the node gains or loses."""
    body = uuid.split("-", 1)[1] if "-" in uuid else uuid
    head = body[:8].lower()
    return f"gpu-{head if _HEX8.match(head) else short_hash(uuid, length=8)}"


def _attr(value: str | int) -> dict[str, str | int]:
    return {"int": value} if isinstance(value, int) else {"string": value}


def _read(attributes: Mapping[str, Any], name: str) -> str | int | None:
    value = attributes.get(f"{ATTRIBUTE_DOMAIN}/{name}") or {}
    found = value.get("string", value.get("int"))
    return found if isinstance(found, str | int) else None


@dataclass(frozen=True)
class CounterSet:
    """A shared counter set: one per GPU, guarding its memory (and compute, or MIG slices)."""

    name: str
    counters: tuple[tuple[str, str], ...]  # (counter, quantity)

    def manifest(self) -> dict[str, Any]:
        return {"name": self.name, "counters": {k: {"value": v} for k, v in self.counters}}

    @classmethod
    def from_manifest(cls, body: Mapping[str, Any]) -> CounterSet | None:
        """A published counter set read back; None for one whose values are not quantities."""
        try:
            counters = tuple(sorted((str(k), str(v["value"])) for k, v in (body.get("counters") or {}).items()))
            for _, value in counters:
                parse_quantity(value)
        except (ValueError, TypeError, KeyError, AttributeError):
            return None
        return cls(str(body.get("name", "")), counters)


@dataclass(frozen=True)
class Device:
    """One device of a node's pool, as gpuslice means it.

    ``kind`` is what a tenant asks for: ``slice`` (a memory slice of ``slice_size``), ``full`` (a
    whole GPU in memory mode), ``shared`` (a consumable-capacity device) or the MIG profile name.
    ``memory`` is the GPU memory the device stands for; a shared device's capacity is taken in
    steps of ``slice_size``.
    """

    name: str
    policy: str
    mode: Mode
    kind: str
    gpu_uuid: str
    gpu_index: int
    product_name: str
    pci_bus_id: str
    memory: int
    slice_size: str | None = None
    profile: str | None = None
    placement: tuple[int, int] | None = None  # MIG: (first memory slice, memory slices)
    counter_set: str | None = None
    counters: tuple[tuple[str, str], ...] = ()
    # The policy's spec.taints (key, value, effect): on the device itself, so they reach the
    # scheduler with the device and cost no object of their own (KEP-5055 device taints).
    taints: tuple[tuple[str, str, str], ...] = ()
    facts: GpuFacts = NO_FACTS  # the GPU's NVIDIA attributes (planning.attributes)
    engines: Engines | None = None  # a MIG device's share of the GPU's engines (NVIDIA's capacities)
    # "MPS" when the policy's slicing.isolation asks for it: part of what the device is (a claim
    # holding it gets MPS limits), so a change of isolation is a change of the device.
    isolation: str | None = None
    # A static MIG device's instance UUID, published as NVIDIA's ``uuid`` (dra-driver-nvidia-gpu's
    # MigDeviceInfo.GetDevice); the agent knows it (the instance exists), the plan does not.
    mig_uuid: str | None = None

    @property
    def traits(self) -> ModeTraits:
        """What devices of this one's mode are (``planning.mode_traits``)."""
        traits = traits_of(self.mode)
        assert traits is not None, self.mode  # Mode is the traits table's keys (tests/unit/planning/test_modes.py)
        return traits

    @property
    def whole_gpu(self) -> bool:
        """The device is the GPU itself (not a part of it): ``uuid`` rather than ``parentUUID``."""
        return self.kind in ("full", "shared")

    def manifest(self) -> dict[str, Any]:
        attributes: dict[str, Any] = {
            f"{ATTRIBUTE_DOMAIN}/policy": _attr(self.policy),
            f"{ATTRIBUTE_DOMAIN}/mode": _attr(self.mode),
            f"{ATTRIBUTE_DOMAIN}/productName": _attr(self.product_name[:64]),
            f"{ATTRIBUTE_DOMAIN}/index": _attr(self.gpu_index),
            f"{ATTRIBUTE_DOMAIN}/{'uuid' if self.whole_gpu else 'parentUUID'}": _attr(self.gpu_uuid),
            **nvidia_attributes(self.kind, self.gpu_uuid, self.gpu_index, self.product_name, self.pci_bus_id,
                                self.facts, self.profile),
            **topology_attributes(self.kind, self.facts),
        }
        if self.mig_uuid:
            attributes[MIG_UUID] = _attr(self.mig_uuid)
        if self.kind == "full":
            attributes[f"{ATTRIBUTE_DOMAIN}/sliceSize"] = _attr(FULL_SLICE_SIZE)
        elif self.slice_size is not None:
            attributes[f"{ATTRIBUTE_DOMAIN}/sliceSize"] = _attr(self.slice_size)
        if self.isolation is not None:
            attributes[f"{ATTRIBUTE_DOMAIN}/isolation"] = _attr(self.isolation)
        if self.profile is not None and self.placement is not None:
            attributes[f"{ATTRIBUTE_DOMAIN}/profile"] = _attr(self.profile)
            attributes[f"{ATTRIBUTE_DOMAIN}/placementStart"] = _attr(self.placement[0])
            attributes[f"{ATTRIBUTE_DOMAIN}/placementSize"] = _attr(self.placement[1])
        device: dict[str, Any] = {"name": self.name, "attributes": attributes}
        if self.traits.consumable:
            step = format_bytes(quantity_bytes(self.slice_size or "0"))
            device["allowMultipleAllocations"] = True
            device["capacity"] = {"memory": {"value": format_bytes(self.memory), "requestPolicy": {
                "default": step, "validRange": {"min": step, "step": step}}}}
        else:
            device["capacity"] = {"memory": {"value": format_bytes(self.memory)}, **mig_capacities(self.engines)}
        if self.counter_set is not None:
            device["consumesCounters"] = [{"counterSet": self.counter_set,
                                           "counters": {k: {"value": v} for k, v in self.counters}}]
        if self.taints:
            # No empty value: the apiserver omits it, and the published device must read back equal.
            device["taints"] = [{"key": k, **({"value": v} if v else {}), "effect": e} for k, v, e in self.taints]
        return device

    @classmethod
    def from_manifest(cls, body: Mapping[str, Any]) -> Device | None:
        """A published device read back; None for one gpuslice did not make (or cannot read)."""
        attributes = body.get("attributes") or {}
        policy, mode = _read(attributes, "policy"), _read(attributes, "mode")
        uuid = _read(attributes, "uuid") or _read(attributes, "parentUUID")
        index = _read(attributes, "index")
        traits = traits_of(str(mode))
        if not isinstance(policy, str) or traits is None or not isinstance(uuid, str) or not isinstance(index, int):
            return None
        size, profile = _read(attributes, "sliceSize"), _read(attributes, "profile")
        isolation = _read(attributes, "isolation")
        start, span = _read(attributes, "placementStart"), _read(attributes, "placementSize")
        kind = traits.kind(str(size), str(profile))
        uses = (body.get("consumesCounters") or [{}])[0]
        capacity = body.get("capacity") or {}
        try:
            memory = quantity_bytes(str((capacity.get("memory") or {}).get("value", "0")))
        except ValueError:
            return None
        return cls(
            name=str(body.get("name", "")), policy=policy, mode=traits.name, kind=kind, gpu_uuid=uuid,
            gpu_index=index, product_name=str(_read(attributes, "productName") or ""),
            pci_bus_id=str((attributes.get(PCI_BUS_ID) or {}).get("string", "")), memory=memory,
            slice_size=str(size) if isinstance(size, str) and size != FULL_SLICE_SIZE else None,
            profile=str(profile) if isinstance(profile, str) else None,
            placement=(start, span) if isinstance(start, int) and isinstance(span, int) else None,
            counter_set=uses.get("counterSet"),
            counters=tuple(sorted((k, str(v.get("value"))) for k, v in (uses.get("counters") or {}).items())),
            taints=tuple((str(t.get("key", "")), str(t.get("value", "")), str(t.get("effect", "")))
                         # The agent's hold on a device whose change waits: a state, not what it is.
                         for t in body.get("taints") or [] if t.get("key") != PENDING_TAINT_KEY),
            facts=read_facts(attributes), engines=read_engines(capacity),
            isolation=isolation if isinstance(isolation, str) else None,
            mig_uuid=str((attributes.get(MIG_UUID) or {}).get("string")) if traits.instances and MIG_UUID in attributes
            else None,
        )


def published_kind(device: Mapping[str, Any]) -> str:
    """The kind of any published device (memory mode's rules for one without a known mode)."""
    traits = traits_of(text_attribute(device, "mode")) or MEMORY
    return traits.kind(text_attribute(device, "sliceSize"), text_attribute(device, "profile"))


def without_instance_uuid(device: Mapping[str, Any]) -> dict[str, Any]:
    """A published device without its static MIG instance's UUID: what a plan made without the
    instances (the controller's) can know of it."""
    attributes = device.get("attributes") or {}
    traits = traits_of(str(_read(attributes, "mode")))
    if traits is None or not traits.instances or MIG_UUID not in attributes:
        return dict(device)
    return {**device, "attributes": {k: v for k, v in attributes.items() if k != MIG_UUID}}


def gpu_ref(gpu: Gpu) -> dict[str, Any]:
    """The fields every device of ``gpu`` repeats (keyword arguments of :class:`Device`)."""
    return {"gpu_uuid": gpu.uuid, "gpu_index": gpu.index, "product_name": gpu.product_name,
            "pci_bus_id": gpu.pci_bus_id, "facts": GpuFacts.of(gpu)}


def device_name(gpu: Gpu, policy: str, what: str) -> str:
    """``gpu-2d3e5f1a-inference-10gi-3``; the policy becomes a hash when the name would pass 63."""
    tag = gpu_tag(gpu.uuid)
    room = 63 - len(f"{tag}--{what}")
    return f"{tag}-{policy if len(policy) <= room else 'p' + short_hash(policy, length=8)}-{what}"
