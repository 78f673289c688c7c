"""The one reader of a GpuSlicePolicy body that may not parse: its tenants and admin namespaces (pure).

``api.resource.parse_policy`` turns a valid body into a model, and most code reads that. A few
readers must act on what a body names whether it parses or not: the namespaces to label for the
tenancy rule (which reads the raw spec at admission), the webhook's maxMemory (a lowering applies
at once), the kubelet plugin's last check of who may use a device, the bench and the demo. They
read the body here, so a tenant without a namespace, a null list or a spec that is not an object
means the same to each of them (nothing named) and crashes none.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpuslice.jsontypes import Body, Object, objects_in


@dataclass(frozen=True)
class TenantEntry:
    """One of ``spec.tenants`` as written: its namespace, and its maxMemory unparsed."""

    namespace: str
    max_memory: str | None  # spec.tenants[].maxMemory as written; None when not given


def policy_spec(body: Body) -> Body:
    """The body's ``spec``; {} when it has none, or one that is not an object."""
    spec = body.get("spec")
    return spec if isinstance(spec, Mapping) else {}


def raw_tenants(body: Body) -> list[Object]:
    """The entries of ``spec.tenants`` that are objects, as written (to copy one into a patch)."""
    return objects_in(policy_spec(body).get("tenants"))


def tenants(body: Body) -> list[TenantEntry]:
    """The tenants the body names, in order: entries without a namespace name none and are left out."""
    found = []
    for raw in raw_tenants(body):
        namespace, memory = raw.get("namespace"), raw.get("maxMemory")
        if namespace is not None and namespace != "":
            found.append(TenantEntry(str(namespace), None if memory is None else str(memory)))
    return found


def tenant_namespaces(body: Body) -> list[str]:
    """The namespaces ``spec.tenants`` names, in order."""
    return [tenant.namespace for tenant in tenants(body)]


def admin_namespaces(body: Body) -> list[str]:
    """The namespaces ``spec.adminAccess.namespaces`` names, in order (entries that are not names left out)."""
    admin = policy_spec(body).get("adminAccess")
    named = admin.get("namespaces") if isinstance(admin, Mapping) else None
    return [n for n in named if isinstance(n, str) and n] if isinstance(named, list | tuple) else []
