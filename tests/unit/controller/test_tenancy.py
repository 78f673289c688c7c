"""Which tenants the admission policy may admit: only once their quota is in place, by namespace UID."""

from __future__ import annotations

from typing import Any, cast

import pytest

from gpuslice.api.resource import GpuSlicePolicy
from gpuslice.api.status import AdmittedTenant
from gpuslice.controller.admin_access import NamespaceView
from gpuslice.controller.tenancy import admitted_tenants, tenancy_unenforced
from gpuslice.kube.client import Forbidden, KubeClient, KubeError, NotReady

POLICY = GpuSlicePolicy.model_validate({
    "metadata": {"name": "p"},
    "spec": {"slicing": {"mode": "memory", "sliceSize": "10Gi"},
             "tenants": [{"namespace": "limited", "maxSlices": 1}, {"namespace": "free"}, {"namespace": "missing"}]},
})
QUOTA = "/api/v1/namespaces/limited/resourcequotas/gpuslice-p"


def ns(uid: str, active: bool = True) -> NamespaceView:
    return NamespaceView({}, active, uid)


def names(found: list[AdmittedTenant]) -> list[tuple[str, str]]:
    return [(a.namespace, a.uid) for a in found]


def test_admitted_once_the_quota_is_in_place() -> None:
    namespaces = {"limited": ns("u1"), "free": ns("u2")}
    assert names(admitted_tenants(POLICY, namespaces, [])) == [], "a report alone admits nobody"
    assert names(admitted_tenants(POLICY, namespaces, [], converged=True, failed={QUOTA})) == [("free", "u2")]
    assert names(admitted_tenants(POLICY, namespaces, [], converged=True)) == [("free", "u2"), ("limited", "u1")]


def test_a_namespace_made_again_or_removed_from_tenants_is_admitted_no_more() -> None:
    before = [AdmittedTenant(namespace="limited", uid="u1"), AdmittedTenant(namespace="gone", uid="u9")]
    assert names(admitted_tenants(POLICY, {"limited": ns("u1")}, before)) == [("limited", "u1")]
    assert names(admitted_tenants(POLICY, {"limited": ns("u3")}, before)) == [], "a new incarnation waits"
    assert names(admitted_tenants(POLICY, {"limited": ns("u1", active=False)}, before)) == []
    # A quota that could not be updated leaves an admitted tenant admitted: its quota is still there.
    assert names(admitted_tenants(POLICY, {"limited": ns("u1")}, before, converged=True, failed={QUOTA})) == [
        ("limited", "u1")]


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
