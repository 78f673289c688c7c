"""Helpers of the scheduler retry's cluster tests: the retry's stamp on a DeviceClass, whether
kube-scheduler turned a pod away (its own PodScheduled verdict), and a pod of two claims."""

from __future__ import annotations

from typing import Any

from gpuslice.controller.retry import RETRY_AT
from gpuslice.kube.client import KubeClient, NotFound
from gpuslice.planning.reads.retry import turned_away
from tests.cluster.claims import pod_using
from tests.cluster.kubeutil import RESOURCE


async def retry_stamp(kube: KubeClient, klass: str) -> str | None:
    """When the retry last nudged the pods of ``klass`` (its annotation on the DeviceClass)."""
    body = await kube.get(f"{RESOURCE}/deviceclasses/{klass}")
    found: str | None = (body["metadata"].get("annotations") or {}).get(RETRY_AT)
    return found


async def is_turned_away(kube: KubeClient, namespace: str, pod: str) -> bool:
    """Whether the scheduler turned the pod away; False for a pod gone (churned pods come and go)."""
    try:
        body: dict[str, Any] = await kube.get(f"/api/v1/namespaces/{namespace}/pods/{pod}")
    except NotFound:
        return False
    return turned_away(body)


def two_claims(name: str, first: str, second: str) -> dict[str, Any]:
    """A pod using the claims ``first`` and ``second``."""
    body = pod_using(name, first)
    body["spec"]["resourceClaims"].append({"name": "other", "resourceClaimName": second})
    body["spec"]["containers"][0]["resources"]["claims"].append({"name": "other"})
    return body
