"""The one reader of resource.k8s.io JSON: claims' allocations, published devices, pools (pure).

The API server hands ResourceClaims and ResourceSlices over as plain JSON. Each
question gpuslice asks of them (which of our devices a claim holds, what a shared
device consumed, whose policy made a device, which generation of a pool counts)
is answered here once, so a field the API renames or a default it adds is
mended in one place, and every reader agrees on what a missing field means.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NotRequired, TypedDict

from gpuslice.dra.names import ATTR_POLICY, ATTRIBUTE_DOMAIN, DRIVER
from gpuslice.dra.quantity import quantity_bytes
from gpuslice.dra.slice_wire import slice_devices
from gpuslice.jsontypes import Body

# A device or device taint as published (JSON); planning.devices.Device is a device's typed form.


class AllocationResult(TypedDict):
    """One entry of a claim's ``status.allocation.devices.results``; the optional fields only as present."""

    request: str
    driver: str
    pool: str
    device: str
    adminAccess: NotRequired[bool]
    shareID: NotRequired[str]
    consumedCapacity: NotRequired[dict[str, str]]  # capacity name -> quantity (shared devices)


def result_of(raw: Body) -> AllocationResult:
    """One raw allocation result, typed."""
    result = AllocationResult(request=str(raw.get("request", "")), driver=str(raw.get("driver", "")),
                              pool=str(raw.get("pool", "")), device=str(raw.get("device", "")))
    if raw.get("adminAccess") is not None:
        result["adminAccess"] = bool(raw["adminAccess"])
    if raw.get("shareID") is not None:
        result["shareID"] = str(raw["shareID"])
    if raw.get("consumedCapacity") is not None:
        result["consumedCapacity"] = {str(k): str(v) for k, v in (raw["consumedCapacity"] or {}).items()}
    return result


class ExactRequest(TypedDict):
    """A claim's ``exactly`` request or one of its ``firstAvailable`` subrequests: one way to be met."""

    name: str  # as an allocation result names it: ``<request>``, or ``<request>/<subrequest>``
    deviceClassName: str
    count: int  # 1 when not given
    allocationMode: str  # ExactCount when not given
    adminAccess: bool
    memory: NotRequired[str]  # capacity.requests.memory, as written (consumable capacity)
    selectors: NotRequired[list[str]]  # the expressions of its CEL selectors


class DeviceRequest(TypedDict):
    """One of a claim spec's ``devices.requests``: exactly one way, or the ways it may be met in order."""

    name: str
    exactly: NotRequired[ExactRequest]
    firstAvailable: list[ExactRequest]


def exact_request(raw: Body, name: str) -> ExactRequest:
    """One way a request may be met, typed; ``name`` as allocation results will name it."""
    request = ExactRequest(name=name, deviceClassName=str(raw.get("deviceClassName", "")),
                           count=int(raw.get("count") or 1),
                           allocationMode=str(raw.get("allocationMode") or "ExactCount"),
                           adminAccess=bool(raw.get("adminAccess")))
    memory = ((raw.get("capacity") or {}).get("requests") or {}).get("memory")
    if memory is not None:
        request["memory"] = str(memory)
    selectors = [str((s.get("cel") or {}).get("expression", "")) for s in raw.get("selectors") or []]
    if selectors:
        request["selectors"] = selectors
    return request


def device_requests(spec: Body) -> list[DeviceRequest]:
    """The requests of a ResourceClaim's (or template's) ``spec``."""
    found = []
    for raw in ((spec.get("devices") or {}).get("requests")) or []:
        name = str(raw.get("name", ""))
        request = DeviceRequest(name=name, firstAvailable=[exact_request(s, f"{name}/{s.get('name', '')}")
                                                           for s in raw.get("firstAvailable") or []])
        if raw.get("exactly"):
            request["exactly"] = exact_request(raw["exactly"], name)
        found.append(request)
    return found


def match_attributes(spec: Body, name: str) -> tuple[str, ...]:
    """The ``matchAttribute`` constraints of a claim's (or template's) ``spec`` that bind request ``name``
    (``<request>`` or ``<request>/<subrequest>``) on its own: those naming it or its request, and those
    naming none in a spec of one request. One that also binds another request (a GPU with a NIC of
    another driver) is left out: its devices alone cannot meet it."""
    requests = ((spec.get("devices") or {}).get("requests")) or []
    parent = name.split("/", 1)[0]
    found = []
    for constraint in ((spec.get("devices") or {}).get("constraints")) or []:
        attribute = constraint.get("matchAttribute")
        named = [str(r) for r in constraint.get("requests") or []]
        if not attribute:
            continue
        if not named:
            if len(requests) == 1:
                found.append(str(attribute))
        elif (name in named or parent in named) and all(r.split("/", 1)[0] == parent for r in named):
            found.append(str(attribute))
    return tuple(found)


def request_ways(request: DeviceRequest) -> list[ExactRequest]:
    """How a request may be met: its ``exactly``, else its subrequests in order."""
    return [request["exactly"]] if "exactly" in request else request["firstAvailable"]


def status_results(status: Body, driver: str | None = DRIVER) -> list[AllocationResult]:
    """The allocation results in a claim's ``status``: those of ``driver`` (None: every driver's)."""
    raw = (((status.get("allocation") or {}).get("devices") or {}).get("results")) or []
    return [result_of(r) for r in raw if driver is None or r.get("driver") == driver]


def allocation_results(claim: Body, driver: str | None = DRIVER) -> list[AllocationResult]:
    """The allocation results of a ResourceClaim: those of ``driver`` (None: every driver's)."""
    return status_results(claim.get("status") or {}, driver)


def is_allocated(claim: Body) -> bool:
    """Whether the scheduler has allocated the claim (``status.allocation`` is set)."""
    return bool((claim.get("status") or {}).get("allocation"))


def allocation_node_selector(status: Body) -> Body:
    """The node selector of a claim's allocation (where its devices are); {} when none."""
    return ((status.get("allocation") or {}).get("nodeSelector")) or {}


class ConsumerRef(TypedDict):
    """One entry of a claim's ``status.reservedFor``: who may use the claim (a pod, for the scheduler)."""

    apiGroup: str  # '' for the core group (pods)
    resource: str
    name: str
    uid: str


def reserved_for(status: Body) -> list[ConsumerRef]:
    """The consumers a claim is reserved for, typed (absent fields read as '')."""
    return [ConsumerRef(apiGroup=str(r.get("apiGroup") or ""), resource=str(r.get("resource") or ""),
                        name=str(r.get("name") or ""), uid=str(r.get("uid") or ""))
            for r in status.get("reservedFor") or []]


class DeviceStatus(TypedDict):
    """One entry of a claim's ``status.devices`` (KEP-4817): what a driver says of an allocated device."""

    driver: str
    pool: str
    device: str
    shareID: NotRequired[str]
    conditions: list[Body]  # metav1.Condition, as written
    data: NotRequired[Any]  # the driver's own, any JSON


def device_statuses(status: Body, driver: str | None = DRIVER) -> list[DeviceStatus]:
    """The entries of a claim's ``status.devices``: those of ``driver`` (None: every driver's)."""
    found = []
    for raw in status.get("devices") or []:
        if driver is not None and raw.get("driver") != driver:
            continue
        entry = DeviceStatus(driver=str(raw.get("driver", "")), pool=str(raw.get("pool", "")),
                             device=str(raw.get("device", "")), conditions=list(raw.get("conditions") or []))
        if raw.get("shareID") is not None:
            entry["shareID"] = str(raw["shareID"])
        if "data" in raw:
            entry["data"] = raw["data"]
        found.append(entry)
    return found


def device_condition(entry: DeviceStatus, kind: str) -> Body | None:
    """The condition of type ``kind`` a driver wrote on the device; None when none."""
    return next((c for c in entry["conditions"] if c.get("type") == kind), None)


def admin_access(result: AllocationResult) -> bool:
    """Allocated with adminAccess: the scheduler counts the device as taken by no one."""
    return result.get("adminAccess", False)


def share_id(result: AllocationResult | DeviceStatus) -> str:
    """The share of a device allocated many times (consumable capacity); '' for others."""
    return result.get("shareID", "")


def consumed_quantity(result: AllocationResult) -> str | None:
    """The ``memory`` the result consumed, as written; None when it names none."""
    return result.get("consumedCapacity", {}).get("memory")


def consumed_memory(result: AllocationResult) -> int | None:
    """The ``memory`` the result consumed, in bytes; None when it names none (or none readable)."""
    value = consumed_quantity(result)
    try:
        return quantity_bytes(value) if value is not None else None
    except ValueError:
        return None


def attribute(device: Body, name: str, domain: str = ATTRIBUTE_DOMAIN) -> str | int | bool | None:
    """The value of a device's attribute ``domain/name`` (``name`` alone for an empty domain)."""
    key = f"{domain}/{name}" if domain else name
    value = (device.get("attributes") or {}).get(key) or {}
    for field in ("string", "int", "bool", "version"):
        if field in value:
            found = value[field]
            return found if isinstance(found, str | int | bool) else None
    return None


def text_attribute(device: Body, name: str, domain: str = ATTRIBUTE_DOMAIN) -> str:
    """A string attribute's value; '' when absent or not a string."""
    value = attribute(device, name, domain)
    return value if isinstance(value, str) else ""


def device_policy(device: Body) -> str | None:
    """The GpuSlicePolicy that made a published device (``gpuslice.dev/policy``, fully qualified:
    a bare name would be the driver's domain); None for a device without it."""
    return text_attribute(device, ATTR_POLICY) or None


def device_gpu(device: Body) -> str | None:
    """The physical GPU a published device stands on, by UUID (``uuid``, or ``parentUUID`` for a part)."""
    return text_attribute(device, "uuid") or text_attribute(device, "parentUUID") or None


def device_capacity(device: Body, name: str = "memory") -> str | None:
    """A published device's capacity ``name``, as written; None when it has none."""
    value = ((device.get("capacity") or {}).get(name) or {}).get("value")
    return str(value) if value is not None else None


def device_memory(device: Body) -> int | None:
    """The ``memory`` capacity of a published device, in bytes; None when it has none readable."""
    value = device_capacity(device)
    try:
        return quantity_bytes(value) if value is not None else None
    except ValueError:
        return None


@dataclass(frozen=True)
class MemoryPolicy:
    """A consumable ``memory`` capacity's request policy (KEP-5075), in bytes: what the scheduler
    consumes for a request that asks none (``default``), and how it rounds one that does (up from
    ``least`` in steps of ``step``)."""

    default: int
    least: int
    step: int

    def consumed(self, asked: int | None) -> int:
        """What the scheduler consumes of the device for a request asking ``asked`` (None: nothing)."""
        if asked is None:
            return self.default
        return self.least + max(0, -(-(asked - self.least) // self.step)) * self.step


def memory_policy(device: Body) -> MemoryPolicy | None:
    """The request policy of a device's consumable ``memory`` (a range's: gpuslice publishes no other
    kind); None when it has none readable."""
    policy = ((device.get("capacity") or {}).get("memory") or {}).get("requestPolicy") or {}
    bounds = policy.get("validRange") or {}
    try:
        default, least, step = (quantity_bytes(str(v)) if v is not None else None
                                for v in (policy.get("default"), bounds.get("min"), bounds.get("step")))
    except ValueError:
        return None
    if default is None or least is None or not step:
        return None
    return MemoryPolicy(default, least, step)


def taint_keys(device: Body) -> set[str]:
    return {str(t.get("key")) for t in device.get("taints") or []}


@dataclass(frozen=True)
class PoolGeneration:
    """A pool's newest generation: the scheduler uses only it, and only once all its slices are in."""

    pool: str
    generation: int
    complete: bool  # as many slices of this generation as its resourceSliceCount says
    slices: tuple[Body, ...] = ()  # the specs of its slices of this generation


def newest_of(marks: Iterable[tuple[str, int, int]]) -> dict[str, tuple[int, bool]]:
    """(pool, generation, resourceSliceCount) of each slice -> each pool's newest generation, and
    whether it is complete (the largest count its slices of that generation claim, present)."""
    marks = list(marks)
    newest: dict[str, int] = {}
    for pool, generation, _ in marks:
        newest[pool] = max(newest.get(pool, generation), generation)
    present: dict[str, int] = {}
    expected: dict[str, int] = {}
    for pool, generation, count in marks:
        if generation == newest[pool]:
            present[pool] = present.get(pool, 0) + 1
            expected[pool] = max(expected.get(pool, 1), count)
    return {pool: (generation, present[pool] >= expected[pool]) for pool, generation in newest.items()}


def pool_mark(spec: Body) -> tuple[str, int, int]:
    """(pool, generation, resourceSliceCount) of a ResourceSlice's spec."""
    pool = spec.get("pool") or {}
    return str(pool.get("name", "")), int(pool.get("generation", 0)), int(pool.get("resourceSliceCount", 1))


def newest_generations(specs: Iterable[Body]) -> dict[str, PoolGeneration]:
    """Each pool's newest generation, from ResourceSlice specs (of one driver: the caller picks)."""
    specs = list(specs)
    found = newest_of(pool_mark(s) for s in specs)
    return {pool: PoolGeneration(pool, generation, complete,
                                 tuple(s for s in specs if pool_mark(s)[:2] == (pool, generation)))
            for pool, (generation, complete) in found.items()}


def newest_generation(specs: Iterable[Body], pool: str) -> PoolGeneration | None:
    """One pool's newest generation; None when no slice of it is given."""
    return newest_generations(s for s in specs if pool_mark(s)[0] == pool).get(pool)


def devices_of(generation: PoolGeneration) -> list[Body]:
    """The devices of a pool generation's slices, in slice order."""
    return [d for s in generation.slices for d in slice_devices(s)]
