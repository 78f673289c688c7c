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

Which kinds a policy offers is its mode's business (``SlicingMode.kinds``; all of a
policy's: ``planning.modes.device_kinds``); this module is what every kind shares.
"""

from __future__ import annotations

from collections.abc import Sequence, Set
from dataclasses import dataclass

from gpuslice.api.policy import Tenant
from gpuslice.api.resource import GpuSlicePolicy
from gpuslice.api.status import ClassInForce
from gpuslice.dra.names import ATTR_POLICY, ATTRIBUTE_DOMAIN, DRIVER
from gpuslice.dra.quantity import format_bytes

SLICE, FULL, SHARED = "slice", "full", "shared"


@dataclass(frozen=True)
class DeviceKind:
    """One kind of device of a policy."""

    kind: str  # slice, full, shared or a MIG profile name
    class_name: str
    memory: int  # bytes one device of this kind stands for (a shared allocation: one sliceSize)
    selector: str  # the DeviceClass's CEL selector
    template_suffix: str  # "" for the policy's slices, else -full or -<profile>
    least: int = -1  # bytes the smallest device of this kind holds (a whole GPU: the smallest GPU); -1: memory

    @property
    def least_memory(self) -> int:
        return self.memory if self.least < 0 else self.least

    @property
    def primary(self) -> bool:
        return self.kind in (SLICE, SHARED)


def profile_tag(profile: str) -> str:
    """``1g.10gb+me`` -> ``1g.10gb-me``: a MIG profile as a DNS-subdomain piece."""
    return profile.replace("+", "-")


def _attribute(name: str) -> str:
    return f'device.attributes["{ATTRIBUTE_DOMAIN}"].?{name}.orValue("")'


def selector(policy: str, **attributes: str) -> str:
    """The CEL selector of a DeviceClass: gpuslice's devices of ``policy`` with these attributes."""
    terms = [f'device.driver == "{DRIVER}"', f'{_attribute(ATTR_POLICY)} == "{policy}"']
    terms += [f'{_attribute(name)} == "{value}"' for name, value in attributes.items()]
    return " && ".join(terms)


def quota(tenant: Tenant, kind: DeviceKind) -> int | None:
    """The tenant's limit on ``kind``; None when the tenant has no limit at all. A limited tenant
    gets 0 of every kind its spec does not grant (a whole GPU is not a slice)."""
    if not tenant.count_limited:
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
    """The most GPU memory ``tenant`` can hold through this policy: the sum of quota x size, or
    its maxMemory, whichever is less; None with neither. The sum saturates at ``INT64_MAX`` (about
    9.2 EB: only a spec whose sliceSize no GPU has gets near it), so the status that reports it can
    always be written."""
    bounds = [b for b in (tenant.max_memory_bytes,) if b is not None]
    if tenant.count_limited:
        bounds.append(min(sum((quota(tenant, k) or 0) * k.memory for k in kinds), INT64_MAX))
    return min(bounds) if bounds else None


def template_names(policy: GpuSlicePolicy, tenant: Tenant, kinds: list[DeviceKind]) -> dict[str, DeviceKind]:
    """The claim templates a tenant gets, by name: ``<claimTemplateName>`` for one device of the
    smallest kind it may use (the slices in memory and shared mode), and one per other kind."""
    base = policy.spec.claim_template_name
    allowed = usable(tenant, kinds)
    names: dict[str, DeviceKind] = {}
    primary = next((k for k in allowed if k.primary), None)
    if primary is None and allowed and not any(k.primary for k in kinds):
        primary = allowed[0]  # a mode of no primary kind (MIG): the smallest kind the tenant may use
    if primary is not None:
        names[base] = primary
    for kind in allowed:
        if not kind.primary:
            names[base + kind.template_suffix] = kind
    return names


def aligned_template_name(base: str, count: int) -> str:
    """``gpu-slice-full-x4``: the template of ``count`` whole GPUs that sit together (spec.topology)."""
    return f"{base}-full-x{count}"


def all_template_names(policy: GpuSlicePolicy, kinds: Sequence[DeviceKind]) -> set[str]:
    """Every template name the policy (of ``kinds``) may make in some tenant (for conflicts between policies)."""
    base = policy.spec.claim_template_name
    aligned = {aligned_template_name(base, c) for c in policy.spec.topology.counts} if policy.spec.topology else set()
    return {base} | {base + k.template_suffix for k in kinds if not k.primary} | aligned


def classes_in_force(kinds: Sequence[DeviceKind], failed: Set[str] = frozenset(),
                     before: Sequence[ClassInForce] = ()) -> list[ClassInForce]:
    """The record of what the policy's DeviceClasses enforce once a converge applied them: one
    entry per kind, except that a class that could not be applied (its name in ``failed``) keeps
    what was recorded for it ``before``, since the old class still stands (or none, for a new one)."""
    kept = {c.name: c for c in before}
    found = []
    for kind in kinds:
        if kind.class_name in failed:
            if kind.class_name in kept:
                found.append(kept[kind.class_name])
            continue
        found.append(ClassInForce(name=kind.class_name, kind=kind.kind, shared=kind.kind == SHARED,
                                  memory=format_bytes(kind.memory), least_memory=format_bytes(kind.least_memory)))
    return found
