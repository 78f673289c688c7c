"""Which tenants the admission policy may admit: by namespace UID, a tenant without limits once
converged, a limited one only for what its quota enforces now (status.hard), at the spec's limits."""

from __future__ import annotations

import datetime
from typing import Any, cast

import pytest

from gpuslice.api.resource import GpuSlicePolicy
from gpuslice.api.status import AdmittedTenant, LimitsInForce
from gpuslice.controller.admin_access import NamespaceView
from gpuslice.controller.tenancy import QuotaView, admitted_tenants, tenancy_unenforced
from gpuslice.kube.client import Forbidden, KubeClient, KubeError, NotReady
from gpuslice.planning.modes import device_kinds
from gpuslice.planning.selection import Selection

POLICY = GpuSlicePolicy.model_validate({
    "metadata": {"name": "p"},
    "spec": {"slicing": {"mode": "memory", "sliceSize": "10Gi", "allowFullGpu": True},
             "tenants": [{"namespace": "limited", "maxSlices": 2}, {"namespace": "free"}, {"namespace": "missing"}]},
})
KINDS = device_kinds(POLICY, Selection(()))
SLICES, FULL = "p.gpuslice.dev.deviceclass.resource.k8s.io/devices", "full.p.gpuslice.dev.deviceclass.resource.k8s.io/devices"
MADE = "2026-11-02T10:00:00Z"
LATER = datetime.datetime(2026, 11, 2, 10, 0, 5, tzinfo=datetime.UTC)
IN_FORCE = {("limited", "gpuslice-p"): QuotaView("p", MADE, {SLICES: "2", FULL: "0"})}
NAMESPACES = {"limited": NamespaceView({}, True, "u1"), "free": NamespaceView({}, True, "u2")}


def ns(uid: str, active: bool = True) -> NamespaceView:
    return NamespaceView({}, active, uid)


def names(found: list[AdmittedTenant]) -> list[tuple[str, str]]:
    return [(a.namespace, a.uid) for a in found]


def admit(namespaces: dict[str, NamespaceView] = NAMESPACES, before: list[AdmittedTenant] | None = None,
          quotas: dict[tuple[str, str], QuotaView] | None = None, now: datetime.datetime = LATER,
          converged: bool = False, policy: GpuSlicePolicy = POLICY) -> list[AdmittedTenant]:
    kinds = device_kinds(policy, Selection(()))
    return admitted_tenants(policy, namespaces, before or [], kinds=kinds, quotas=IN_FORCE if quotas is None else quotas,
                            converged=converged, now=now).tenants


def test_a_tenant_without_limits_once_converged_a_limited_one_once_its_quota_is_in_force() -> None:
    assert names(admit(quotas={})) == [], "a report alone admits nobody, and a limited tenant needs its quota"
    assert names(admit(quotas={}, converged=True)) == [("free", "u2")]
    [free, limited] = admit(converged=True)
    assert limited == AdmittedTenant(namespace="limited", uid="u1", limits=LimitsInForce(max_slices=2),
                                     classes=["full.p.gpuslice.dev", "p.gpuslice.dev"], since=MADE)
    assert free == AdmittedTenant(namespace="free", uid="u2")


def test_a_quota_that_exists_but_is_not_synced_counts_nothing() -> None:
    """kube-controller-manager fills status.hard: until then the apiserver's quota admission counts nothing."""
    assert names(admit(quotas={("limited", "gpuslice-p"): QuotaView("p", MADE, {})})) == []
    # Synced to an older limit (maxSlices was 8): the slices are not in force yet, the whole GPUs are.
    stale = {("limited", "gpuslice-p"): QuotaView("p", MADE, {SLICES: "8", FULL: "0"})}
    [limited] = admit(quotas=stale)
    assert limited.classes == ["full.p.gpuslice.dev"]
    # A kind just added (allowFullGpu) is counted only once status.hard has it.
    [limited] = admit(quotas={("limited", "gpuslice-p"): QuotaView("p", MADE, {SLICES: "2"})})
    assert limited.classes == ["p.gpuslice.dev"]
    # Another policy's quota of that name, or a quantity in another form, is read as the quota says.
    assert admit(quotas={("limited", "gpuslice-p"): QuotaView("q", MADE, {SLICES: "2", FULL: "0"})}) == []
    big = POLICY.model_validate({**POLICY.model_dump(by_alias=True, exclude_none=True), "spec": {
        **POLICY.model_dump(by_alias=True, exclude_none=True)["spec"], "tenants": [{"namespace": "limited", "maxSlices": 1000}]}})
    [limited] = admit(quotas={("limited", "gpuslice-p"): QuotaView("p", MADE, {SLICES: "1k", FULL: "0"})}, policy=big)
    assert limited.limits == LimitsInForce(max_slices=1000)


def test_a_quota_made_this_second_admits_once_the_second_is_over() -> None:
    """Claims carry whole-second creation times: one made in the quota's own second may predate it."""
    within = datetime.datetime(2026, 11, 2, 10, 0, 0, 400000, tzinfo=datetime.UTC)
    admission = admitted_tenants(POLICY, NAMESPACES, [], kinds=KINDS, quotas=IN_FORCE, now=within)
    assert names(admission.tenants) == []
    assert admission.again_in == 0.6


def test_a_namespace_made_again_or_removed_from_tenants_is_admitted_no_more() -> None:
    before = [AdmittedTenant(namespace="free", uid="u2"), AdmittedTenant(namespace="gone", uid="u9")]
    assert names(admit({"free": ns("u2")}, before)) == [("free", "u2")]
    assert names(admit({"free": ns("u3")}, before)) == [], "a new incarnation waits"
    assert names(admit({"free": ns("u2", active=False)}, before)) == []
    # A limited tenant is admitted from what its quota enforces, never from an earlier record.
    limited = [AdmittedTenant(namespace="limited", uid="u1", limits=LimitsInForce(max_slices=2),
                              classes=["p.gpuslice.dev"], since=MADE)]
    assert admit(before=limited, quotas={}) == []


class _Refusing:
    def __init__(self, error: KubeError) -> None:
        self.error = error

    async def request(self, *args: Any, **kwargs: Any) -> Any:
        raise self.error


async def test_a_probe_the_api_server_was_not_ready_to_judge_proves_nothing_either_way() -> None:
    """A just-started API server refuses the dry run before its admission policies are loaded:
    that is asked again soon (the error propagates), not reported as tenancy not enforced."""
    not_ready = NotReady(403, "Forbidden", 'resourceclaims "x" is forbidden: not yet ready to handle request', None)
    with pytest.raises(NotReady):
        await tenancy_unenforced(cast(KubeClient, _Refusing(not_ready)), "gpuslice-system", "p", "p.gpuslice.dev")
    rbac = Forbidden(403, "Forbidden", "User cannot create resource resourceclaims", None)
    found = await tenancy_unenforced(cast(KubeClient, _Refusing(rbac)), "gpuslice-system", "p", "p.gpuslice.dev")
    assert found is not None
    assert "could not prove" in found
