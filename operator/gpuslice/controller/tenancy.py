"""Tenancy as the controller sees to it: which tenants are admitted, and proof that the
apiserver enforces the rule before a policy is called Valid.

The rule itself is the static admission policy ``gpuslice-tenancy`` (manifests/admission.yaml,
built in planning.admission). Two things here feed and check it:

- ``status.admittedTenants``: a tenant namespace is admitted (by UID) only once its quota is in
  place, so no claim of a limited tenant is ever made before the quota that counts it;
- the probe: a dry-run claim for the policy's class from the controller's own namespace, which
  can never be a tenant. Only a refusal proves the apiserver enforces tenancy for this policy
  now; a timer would only guess.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set
from typing import Any

from gpuslice.api.resource import GpuSlicePolicy
from gpuslice.api.status import AdmittedTenant
from gpuslice.controller.admin_access import NamespaceView
from gpuslice.kube.client import KubeClient, KubeError, NotReady
from gpuslice.planning.admission import TENANCY, TENANCY_DENIAL
from gpuslice.planning.cluster_objects import quota_name


def admitted_tenants(
    policy: GpuSlicePolicy, namespaces: Mapping[str, NamespaceView], previously: Sequence[AdmittedTenant], *,
    converged: bool = False, failed: Set[str] = frozenset(),
) -> list[AdmittedTenant]:
    """The tenants the admission policy may admit. Without a converge, only those already admitted
    that are still tenants, in the same namespace incarnation; after one, also every tenant whose
    quota (if it has limits) was put in place by it (``failed``: paths that could not be applied)."""
    previous = {a.namespace: a.uid for a in previously}
    found: dict[str, str] = {}
    for tenant in policy.spec.tenants:
        view = namespaces.get(tenant.namespace)
        if view is None or not view.active or not view.uid:
            continue
        if previous.get(tenant.namespace) == view.uid:
            found[tenant.namespace] = view.uid
            continue
        quota = f"/api/v1/namespaces/{tenant.namespace}/resourcequotas/{quota_name(policy.name)}"
        if converged and not (tenant.limited and quota in failed):
            found[tenant.namespace] = view.uid
    return [AdmittedTenant(namespace=ns, uid=uid) for ns, uid in sorted(found.items())]


def probe_claim(class_name: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"generateName": "gpuslice-tenancy-probe-"},
        "spec": {"devices": {"requests": [{"name": "probe", "exactly": {"deviceClassName": class_name}}]}},
    }


async def tenancy_unenforced(kube: KubeClient, namespace: str, policy: str, class_name: str) -> str | None:
    """None when the apiserver refuses a non-tenant a claim of ``class_name``; else what is wrong."""
    fix = (f" Apply manifests/admission.yaml (the ValidatingAdmissionPolicy {TENANCY} and its binding) after"
           " crds/; until tenancy is enforced, no node agent publishes this policy's devices.")
    try:
        await kube.request("POST", f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims",
                           probe_claim(class_name), query={"dryRun": "All"})
    except KubeError as error:
        if error.transient:
            raise  # e.g. an API server just started, its admission not ready yet: ask again soon
        if f"ValidatingAdmissionPolicy '{TENANCY}'" in error.message and "failed to configure" in error.message:
            # The rule is there and fails closed, but the API server cannot evaluate it yet: after a
            # restart its REST mapper learns the GpuSlicePolicy CRD (the rule's paramKind) within 30 s.
            raise NotReady(error.status, error.reason, error.message, error.body) from error
        if TENANCY_DENIAL in error.message and f"GpuSlicePolicy {policy}" in error.message:
            return None
        return (f"gpuslice could not prove that tenancy is enforced: a dry-run ResourceClaim for DeviceClass"
                f" {class_name} from namespace {namespace} (never a tenant) got {error.status} {error.reason}:"
                f" {error.message}.{fix}")
    return (f"tenancy is not enforced: the apiserver admitted a dry-run ResourceClaim for DeviceClass {class_name}"
            f" from namespace {namespace}, which is not a tenant.{fix}")
