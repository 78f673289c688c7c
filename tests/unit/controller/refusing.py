"""A stand-in API server for a reconcile that refuses its template writes (as an overloaded server
would) and its tenancy probe (as the admission policy does), and the world of one policy it serves."""

from __future__ import annotations

from typing import Any

from gpuslice.controller.admin_access import NamespaceView
from gpuslice.controller.world import World
from gpuslice.kube.client import KubeError
from tests.builders import policy


class Refuses:
    """Enough of KubeClient for a reconcile; template writes are refused (as an overloaded server
    would) while ``refuse`` is set, and the tenancy probe is refused as the admission policy does."""

    def __init__(self) -> None:
        self.refuse = True
        self.applied: list[str] = []

    async def apply(self, path: str, body: dict[str, Any], *, field_manager: str, force: bool = True) -> dict[str, Any]:
        if self.refuse and "/resourceclaimtemplates/" in path:
            raise KubeError(503, "ServiceUnavailable", "the server is currently unable to handle the request", None)
        self.applied.append(path)
        return body

    async def list(self, path: str, **query: Any) -> list[dict[str, Any]]:
        return []

    async def get(self, path: str, **query: Any) -> dict[str, Any]:
        if path.endswith("/validatingadmissionpolicybindings/gpuslice-non-tenants"):
            return {"spec": {"policyName": "gpuslice-non-tenants", "validationActions": ["Deny"]}}
        if path.endswith("/validatingadmissionpolicies/gpuslice-non-tenants"):
            return {"spec": {}}
        raise KubeError.of(404, "NotFound", "not found")

    async def merge_patch(self, path: str, patch: dict[str, Any]) -> dict[str, Any]:
        return patch

    async def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return body

    async def request(self, method: str, path: str, body: Any = None, **_: Any) -> dict[str, Any]:
        raise KubeError.of(403, "Forbidden", "resourceclaims.resource.k8s.io is forbidden: ValidatingAdmissionPolicy"
                        " 'gpuslice-tenancy' with binding 'gpuslice-tenancy' denied request: ResourceClaim probe:"
                        " namespace gpuslice-system is not a tenant of GpuSlicePolicy team-a, so ...", None)


POLICY = policy("team-a", {"mode": "memory", "sliceSize": "10Gi"}, generation=1, uid="u-1", tenants=["a"])
WORLD = World(policies={"team-a": POLICY}, namespaces={"a": NamespaceView({}, True, "uid-a")}, nodes={}, slices=[],
              claims=[])


def templates(kube: Refuses) -> list[str]:
    return [p for p in kube.applied if "/resourceclaimtemplates/" in p]
