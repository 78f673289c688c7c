"""The kinds of device a policy offers, each with its own DeviceClass, quota and template.

ResourceQuota counts devices per DeviceClass, not memory (upstream has no quota on
capacity). So a policy gets one DeviceClass per kind of device it publishes (the
memory slice, the whole GPU, each MIG profile, the shared device), each class
selects exactly that kind by the attributes the agent publishes, and each tenant
gets a quota per class. A tenant's memory is then bounded by the sum over kinds of
quota x the memory one device of the kind stands for.

Class names are ``<policy>.gpuslice.dev`` for the slices (memory and shared mode)
and ``<kind>.<policy>.gpuslice.dev`` for the others. Policy names hold no dots
(the CRD allows a DNS label only), so the policy of a class is the label just
before ``gpuslice.dev``: the tenancy admission policy reads it that way.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuslice.api.policy import Tenant
from gpuslice.api.resource import GpuSlicePolicy
from gpuslice.dra.names import ATTR_POLICY, ATTRIBUTE_DOMAIN, DRIVER, device_class_name
from gpuslice.inventory.catalog import GI
from gpuslice.planning.selection import Selection

SLICE, FULL, SHARED = "slice", "full", "shared"


@dataclass(frozen=True)
class DeviceKind:
    """One kind of device of a policy."""

    kind: str  # slice, full, shared or a MIG profile name
    class_name: str
    memory: int  # bytes one device of this kind stands for (a shared allocation: one sliceSize)
    selector: str  # the DeviceClass's CEL selector
    template_suffix: str  # "" for the policy's slices, else -full or -<profile>

    @property
    def primary(self) -> bool:
        return self.kind in (SLICE, SHARED)


def profile_tag(profile: str) -> str:
    """``1g.10gb+me`` -> ``1g.10gb-me``: a MIG profile as a DNS-subdomain piece."""
    return profile.replace("+", "-")


def _attribute(name: str) -> str:
    return f'device.attributes["{ATTRIBUTE_DOMAIN}"].?{name}.orValue("")'


def _selector(policy: str, **attributes: str) -> str:
    terms = [f'device.driver == "{DRIVER}"', f'{_attribute(ATTR_POLICY)} == "{policy}"']
    terms += [f'{_attribute(name)} == "{value}"' for name, value in attributes.items()]
    return " && ".join(terms)


def _mig_memory(profile: str, selection: Selection) -> int:
    """What one instance of ``profile`` has on the GPUs selected (the largest figure); for GPUs the
    catalog does not know, the GB figure in its name read as GiB (above what NVML reports)."""
    known = [p.memory for g in selection.gpus if g.model for p in g.model.mig_profiles if p.name == profile]
    if known:
        return max(known)
    nominal = profile.split(".", 1)[1].removesuffix("+me").removesuffix("gb")
    return int(nominal) * GI if nominal.isdigit() else 0


def device_kinds(policy: GpuSlicePolicy, selection: Selection) -> list[DeviceKind]:
    """The policy's kinds of device, smallest first within MIG, the slices first otherwise."""
    name, slicing = policy.name, policy.spec.slicing
    if slicing.mode == "memory":
        assert slicing.slice_size is not None
        found = [DeviceKind(SLICE, device_class_name(name), slicing.slice_bytes,
                            _selector(name, mode="memory", sliceSize=slicing.slice_size), "")]
        if slicing.allow_full_gpu:
            largest = max((g.memory for g in selection.gpus if g.memory is not None), default=0)
            found.append(DeviceKind(FULL, f"{FULL}.{device_class_name(name)}", largest,
                                    _selector(name, mode="memory", sliceSize="full"), f"-{FULL}"))
        return found
    if slicing.mode == "shared":
        return [DeviceKind(SHARED, device_class_name(name), slicing.slice_bytes, _selector(name, mode="shared"), "")]
    assert slicing.mig is not None
    profiles = list(dict.fromkeys([*(slicing.mig.profiles or []), *(slicing.mig.layout or {})]))
    kinds = [DeviceKind(p, f"{profile_tag(p)}.{device_class_name(name)}", _mig_memory(p, selection),
                        _selector(name, mode="mig", profile=p), f"-{profile_tag(p)}") for p in profiles]
    return sorted(kinds, key=lambda k: (k.memory, k.kind))


def quota(tenant: Tenant, kind: DeviceKind) -> int | None:
    """The tenant's limit on ``kind``; None when the tenant has no limit at all. A limited tenant
    gets 0 of every kind its spec does not grant (a whole GPU is not a slice)."""
    if not tenant.limited:
        return None
    if kind.kind in (SLICE, SHARED):
        return tenant.max_slices or 0
    if kind.kind == FULL:
        return tenant.max_full_gpus or 0
    return (tenant.max_mig_devices or {}).get(kind.kind, 0)


def usable(tenant: Tenant, kinds: list[DeviceKind]) -> list[DeviceKind]:
    """The kinds a tenant may claim at least one of."""
    return [k for k in kinds if quota(tenant, k) != 0]


INT64_MAX = 2**63 - 1  # the most an integer field of an object can hold (the API server refuses more)


def limit_bytes(tenant: Tenant, kinds: list[DeviceKind]) -> int | None:
    """The most GPU memory ``tenant`` can hold through this policy: sum of quota x size, saturated
    at ``INT64_MAX`` (about 9.2 EB: only a spec whose sliceSize no GPU has gets near it), so the
    status that reports it can always be written."""
    if not tenant.limited:
        return None
    return min(sum((quota(tenant, k) or 0) * k.memory for k in kinds), INT64_MAX)


def template_names(policy: GpuSlicePolicy, tenant: Tenant, kinds: list[DeviceKind]) -> dict[str, DeviceKind]:
    """The claim templates a tenant gets, by name: ``<claimTemplateName>`` for one device of the
    smallest kind it may use (the slices in memory and shared mode), and one per other kind."""
    base = policy.spec.claim_template_name
    allowed = usable(tenant, kinds)
    names: dict[str, DeviceKind] = {}
    primary = next((k for k in allowed if k.primary), None)
    if primary is None and policy.spec.slicing.mode == "mig" and allowed:
        primary = allowed[0]
    if primary is not None:
        names[base] = primary
    for kind in allowed:
        if not kind.primary:
            names[base + kind.template_suffix] = kind
    return names


def all_template_names(policy: GpuSlicePolicy) -> set[str]:
    """Every template name the policy may make in some tenant (for conflicts between policies)."""
    base = policy.spec.claim_template_name
    kinds = device_kinds(policy, Selection(()))
    return {base} | {base + k.template_suffix for k in kinds if not k.primary}
