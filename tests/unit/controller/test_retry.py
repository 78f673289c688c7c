"""A converge that failed is retried by the next trigger, even one that normally only reports.

Kopf does not retry event handlers (a tenant namespace appeared), so the 10 s status timer must
pick up a policy whose objects could not be written. The fault (the apiserver refusing a write
once) is injected: a real apiserver cannot be made to refuse on cue.
"""

from __future__ import annotations

from typing import Any, cast

import kopf
import pytest

from gpuslice.controller.admin_access import NamespaceView
from gpuslice.controller.reconcile import Context, World, reconcile
from gpuslice.kube.client import KubeClient, KubeError


class RefusesOnce:
    """Enough of KubeClient for a reconcile; the first template write is refused as an overloaded server would."""

    def __init__(self) -> None:
        self.refuse = True
        self.applied: list[str] = []

    async def apply(self, path: str, body: dict[str, Any], *, field_manager: str, force: bool = True) -> dict[str, Any]:
        if self.refuse and "/resourceclaimtemplates/" in path:
            self.refuse = False
            raise KubeError(503, "ServiceUnavailable", "the server is currently unable to handle the request", None)
        self.applied.append(path)
        return body

    async def list(self, path: str, **query: Any) -> list[dict[str, Any]]:
        return []

    async def merge_patch(self, path: str, patch: dict[str, Any]) -> dict[str, Any]:
        return patch

    async def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return body


POLICY = {
    "apiVersion": "gpuslice.dev/v1alpha1", "kind": "GpuSlicePolicy",
    "metadata": {"name": "team-a", "uid": "u-1", "generation": 1, "creationTimestamp": "2026-11-29T10:00:00Z"},
    "spec": {"slicing": {"mode": "memory", "sliceSize": "10Gi"}, "tenants": [{"namespace": "a"}]},
}
WORLD = World(policies={"team-a": POLICY}, namespaces={"a": NamespaceView({}, {}, True)}, nodes={}, slices=[],
              claims=[])


async def test_status_refresh_converges_again_after_a_failed_write() -> None:
    kube = RefusesOnce()
    ctx = Context(kube=cast(KubeClient, kube), username="system:serviceaccount:gpuslice:controller")

    with pytest.raises(kopf.TemporaryError, match="could not be applied"):
        await reconcile(ctx, POLICY, WORLD)  # e.g. from the namespace event: Kopf will not retry it
    assert not any("/resourceclaimtemplates/" in path for path in kube.applied)

    await reconcile(ctx, POLICY, WORLD, converge_objects=False)  # the status timer
    assert any(path.endswith("/namespaces/a/resourceclaimtemplates/gpu-slice") for path in kube.applied)

    kube.applied.clear()
    await reconcile(ctx, POLICY, WORLD, converge_objects=False)
    assert kube.applied == [], "once converged, the status timer goes back to reporting only"
