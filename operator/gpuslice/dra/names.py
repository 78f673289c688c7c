"""Names gpuslice gives things in resource.k8s.io, in one place."""

from __future__ import annotations

import hashlib

DRIVER = "gpu.gpuslice.dev"
ATTRIBUTE_DOMAIN = "gpuslice.dev"
ATTR_POLICY = "policy"  # every device carries the name of the policy that made it

MANAGED_BY = {"app.kubernetes.io/managed-by": "gpuslice"}
LABEL_POLICY = "gpuslice.dev/policy"
ADMIN_ACCESS_LABEL = "resource.kubernetes.io/admin-access"
ADMIN_ACCESS_OWNERS = "gpuslice.dev/admin-access-for"  # annotation: policies that asked gpuslice to set it


def device_class_name(policy: str) -> str:
    return f"{policy}.{ATTRIBUTE_DOMAIN}"


def quota_resource(device_class: str) -> str:
    """The ResourceQuota key that counts devices of a class (DRA quota)."""
    return f"{device_class}.deviceclass.resource.k8s.io/devices"


def short_hash(*parts: str, length: int = 10) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:length]
