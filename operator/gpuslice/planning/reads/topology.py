"""Where the GPUs sit and which claims' GPUs sit together, from what the agents published (pure).

``gpuslice status`` shows each node's NVLink domains, NUMA nodes and PCIe roots and each claim
holding several GPUs with the alignment they have; ``why`` asks whether some node has ``count`` free
GPUs that share what a claim's constraints ask, and what would free such a set; the controller counts
allocations by the alignment achieved. All of it reads the devices' own attributes
(``inventory.topology``): a GPU that does not publish one shares it with nothing.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpuslice.dra.wire import status_results
from gpuslice.inventory.pci import PCIE_ROOT_ATTRIBUTE
from gpuslice.inventory.topology import (
    ALIGNMENT_ATTRIBUTES,
    ALIGNMENTS,
    NUMA_NODE_ATTRIBUTE,
    NVLINK_DOMAIN_ATTRIBUTE,
    Alignment,
    alignment_name,
    alignment_phrase,
)
from gpuslice.jsontypes import Body
from gpuslice.planning.reads.availability import on_gpu
from gpuslice.planning.reads.occupancy import GpuMap, OccupancyMap
from gpuslice.planning.reads.published import Holder, PublishedDevice

Value = int | str


@dataclass(frozen=True)
class Place:
    """Where one GPU sits: its NUMA node, PCIe root and NVLink domain, None where not published."""

    gpu: str  # UUID
    numa: int | None = None
    pcie: str | None = None
    nvlink: str | None = None

    def value(self, attribute: str) -> Value | None:
        return {NUMA_NODE_ATTRIBUTE: self.numa, PCIE_ROOT_ATTRIBUTE: self.pcie,
                NVLINK_DOMAIN_ATTRIBUTE: self.nvlink}.get(attribute)


def place_of(devices: Iterable[PublishedDevice]) -> Place:
    """A GPU's place from its devices (a MIG device carries no NVLink domain: any that does says it)."""
    devices = list(devices)
    facts = [d.device.facts for d in devices]
    return Place(devices[0].device.gpu_uuid if devices else "",
                 next((f.numa_node for f in facts if f.numa_node is not None), None),
                 next((f.pcie_root for f in facts if f.pcie_root), None),
                 next((f.nvlink_domain for f in facts if f.nvlink_domain), None))


def achieved(places: Sequence[Place]) -> tuple[Alignment, ...]:
    """What every one of ``places`` shares (each GPU once): the levels all publish with one value."""
    unique = list({p.gpu: p for p in places}.values())
    return tuple(level for level in ALIGNMENTS
                 if len({p.value(ALIGNMENT_ATTRIBUTES[level]) for p in unique}) == 1
                 and unique[0].value(ALIGNMENT_ATTRIBUTES[level]) is not None)


@dataclass(frozen=True)
class NodeTopology:
    """One node's GPUs by what they share: ``(value, GPU indexes)`` per NVLink domain, NUMA node and PCIe root."""

    node: str
    nvlink: tuple[tuple[str, tuple[int, ...]], ...] = ()
    numa: tuple[tuple[int, tuple[int, ...]], ...] = ()
    pcie: tuple[tuple[str, tuple[int, ...]], ...] = ()
    unknown_numa: tuple[int, ...] = ()  # GPUs whose NUMA node is not published


def _groups(pairs: Iterable[tuple[Value | None, int]]) -> list[tuple[Value, tuple[int, ...]]]:
    found: dict[Value, list[int]] = defaultdict(list)
    for value, index in pairs:
        if value is not None:
            found[value].append(index)
    return sorted(((v, tuple(sorted(i))) for v, i in found.items()), key=lambda g: (g[1], str(g[0])))


def node_topologies(found: OccupancyMap) -> tuple[NodeTopology, ...]:
    nodes = []
    for node in found.nodes:
        places = [(place_of(g.devices), g.index) for g in node.gpus]
        if not places:
            continue
        nodes.append(NodeTopology(
            node.name,
            tuple((str(v), i) for v, i in _groups((p.nvlink, index) for p, index in places)),
            tuple((int(v), i) for v, i in _groups((p.numa, index) for p, index in places)),
            tuple((str(v), i) for v, i in _groups((p.pcie, index) for p, index in places)),
            tuple(index for p, index in places if p.numa is None)))
    return tuple(nodes)


@dataclass(frozen=True)
class ClaimAlignment:
    """A claim that holds devices of several GPUs: where they are and what they share."""

    namespace: str
    claim: str
    node: str
    gpus: tuple[int, ...]  # indexes
    achieved: str  # alignment_name of what the GPUs share: nvlink-numa-pcie ... any
    granted: str = ""  # the subrequest the scheduler took (an aligned template's: nvlink-numa), if any


def claim_alignments(found: OccupancyMap, claims: Iterable[Body]) -> tuple[ClaimAlignment, ...]:
    """Every claim of gpuslice's devices on two or more GPUs, in name order."""
    where: dict[tuple[str, str], tuple[GpuMap, Place]] = {}
    for gpu in found.gpus:
        place = place_of(gpu.devices)
        for device in gpu.devices:
            where[(gpu.node, device.name)] = (gpu, place)
    aligned = []
    for claim in claims:
        meta = claim.get("metadata") or {}
        assert isinstance(meta, Mapping)
        status = claim.get("status") or {}
        assert isinstance(status, Mapping)
        results = [r for r in status_results(status) if not r.get("adminAccess")]
        held = [where[(r["pool"], r["device"])] for r in results if (r["pool"], r["device"]) in where]
        gpus = {g.uuid: (g, p) for g, p in held}
        if len(gpus) < 2:
            continue
        requests = {r["request"] for r in results}
        granted = next(iter(requests)).split("/", 1)[1] if len(requests) == 1 and "/" in next(iter(requests)) else ""
        aligned.append(ClaimAlignment(
            str(meta.get("namespace", "")), str(meta.get("name", "")), held[0][0].node,
            tuple(sorted(g.index for g, _ in gpus.values())), alignment_name(achieved([p for _, p in gpus.values()])),
            granted))
    return tuple(sorted(aligned, key=lambda a: (a.namespace, a.claim)))


@dataclass(frozen=True)
class AlignedRoom:
    """Whether ``count`` free GPUs that share the asked attributes are on one node now, and if not, the
    set nearest to it and what holds the rest of it."""

    count: int
    phrase: str  # "share an NVLink domain and a NUMA node"
    free: int  # free GPUs of the kind anywhere
    best: int  # the most free ones that share it on one node
    where: str = ""  # that set: "gpu-node-1, NUMA node 0" ...
    freeing: tuple[str, ...] = ()  # claims whose release would free an aligned set (fewest found)
    freeing_where: str = ""  # the set they would free: node, GPUs
    kept_off: tuple[str, ...] = ()  # why GPUs of that set are kept off (tainted, draining)

    @property
    def fits(self) -> bool:
        return self.best >= self.count


WORDS = {NVLINK_DOMAIN_ATTRIBUTE: "NVLink domain", NUMA_NODE_ATTRIBUTE: "NUMA node", PCIE_ROOT_ATTRIBUTE: "PCIe root"}


def _describe(node: str, attributes: Sequence[str], key: tuple[Value | None, ...]) -> str:
    return ", ".join([node, *(f"{WORDS.get(a, a)} {v}" for a, v in zip(attributes, key, strict=True))])


def aligned_room(gpus: Sequence[GpuMap], policy: str, kind: str, count: int, attributes: Sequence[str]) -> AlignedRoom:
    """``count`` devices of ``policy``'s ``kind``, one per GPU (whole GPUs), on GPUs sharing ``attributes``."""
    levels = [a for a in ALIGNMENTS if ALIGNMENT_ATTRIBUTES[a] in attributes]
    groups: dict[tuple[str, tuple[Value | None, ...]], list[tuple[GpuMap, int, int]]] = defaultdict(list)
    free = 0
    for gpu in gpus:
        if policy not in gpu.policies:
            continue
        here = on_gpu(gpu, policy, kind)
        free += here.free
        place = place_of(gpu.devices)
        key = tuple(place.value(a) for a in attributes)
        if (here.free or here.kept_off or _offers(gpu, policy, kind)) and None not in key:
            groups[(gpu.node, key)].append((gpu, here.free, here.kept_off))
    phrase = alignment_phrase(levels)
    if not groups:
        return AlignedRoom(count, phrase, free, 0)
    (node, key), members = max(groups.items(), key=lambda g: (sum(f for _, f, _ in g[1]), g[0][0]))
    best = sum(f for _, f, _ in members)
    room = AlignedRoom(count, phrase, free, best, _describe(node, attributes, key))
    if best >= count:
        return room
    # What would free a set: in each group of enough GPUs, the busy ones whose holders are fewest.
    choices = []
    for (node, key), members in groups.items():
        if len(members) < count:
            continue
        busy = sorted((m for m in members if not m[1]), key=lambda m: (len(_holders(m[0])), m[0].index))
        need = count - sum(f for _, f, _ in members)
        taken = busy[:need]
        holders = sorted({h.ref for gpu, _, _ in taken for h in _holders(gpu)})
        kept = sorted({r for gpu, _, off in taken if off for d in gpu.devices for r in d.reasons})
        choices.append((len(holders), len(kept), node, key, taken, holders, kept))
    if not choices:
        return room
    _, _, node, key, taken, holders, kept = min(choices, key=lambda c: (c[0], c[1], c[2]))
    gpus_named = ", ".join(str(g.index) for g, _, _ in sorted(taken, key=lambda m: m[0].index))
    return AlignedRoom(count, phrase, free, best, room.where, tuple(holders),
                       f"{_describe(node, attributes, key)} (GPUs {gpus_named} held)", tuple(kept))


def _offers(gpu: GpuMap, policy: str, kind: str) -> bool:
    return any(d.device.policy == policy and d.device.kind == kind for d in gpu.devices)


def _holders(gpu: GpuMap) -> list[Holder]:
    return sorted({h for d in gpu.devices for h in d.users}, key=lambda h: (h.namespace, h.claim))
