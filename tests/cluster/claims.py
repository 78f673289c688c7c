"""Claims a tenant writes by hand, the pods that use them, and what became of them: allocated, or
refused (when made, or at allocation, as the pod's Events say)."""

from __future__ import annotations

from typing import Any

import pytest

from gpuslice.kube.client import KubeClient, KubeError
from tests.cluster.kubeutil import PAUSE_IMAGE, RESOURCE, get_or_none, wait_for


def pod_using(name: str, claim_name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": PAUSE_IMAGE, "resources": {"claims": [{"name": "gpu"}]}}],
                     "resourceClaims": [{"name": "gpu", "resourceClaimName": claim_name}]}}


async def allocation(kube: KubeClient, ns: str, name: str) -> dict[str, Any] | None:
    body = await get_or_none(kube, f"{RESOURCE}/namespaces/{ns}/resourceclaims/{name}")
    found: dict[str, Any] | None = ((body or {}).get("status") or {}).get("allocation")
    return found


async def event_saying(kube: KubeClient, ns: str, pod: str, text: str) -> str | None:
    for event in await kube.list(f"/api/v1/namespaces/{ns}/events"):
        if event["involvedObject"]["name"] == pod and text in (event.get("message") or ""):
            return str(event["message"])
    return None


async def pod_event(kube: KubeClient, ns: str, pod: str, text: str) -> str:
    message: str = await wait_for(lambda: event_saying(kube, ns, pod, text), within=60,
                                  what=f"an Event on pod {ns}/{pod} saying {text!r}")
    return message


def request(klass: str, **fields: Any) -> dict[str, Any]:
    return {"deviceClassName": klass, **fields}


def claim(name: str, exactly: dict[str, Any] | None = None, first: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    req: dict[str, Any] = {"name": "gpu"}
    if first is not None:
        req["firstAvailable"] = first
    else:
        req["exactly"] = exactly
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
            "spec": {"devices": {"requests": [req]}}}


async def refused(kube: KubeClient, ns: str, body: dict[str, Any], *words: str) -> str:
    with pytest.raises(KubeError) as error:
        await kube.create(f"{RESOURCE}/namespaces/{ns}/resourceclaims", body)
    assert error.value.status in (403, 422), error.value
    for word in words:
        assert word in error.value.message, error.value.message
    return error.value.message


async def refusal_says(kube: KubeClient, ns: str, body: dict[str, Any], *words: str, within: float = 30) -> str:
    """Wait until the API server refuses ``body`` (a dry run) in words that include ``words``: its
    admission has seen the edit those words are about (a policy's rule and the maxMemory webhook see
    an edit a moment after it is made)."""
    async def said() -> str | None:
        try:
            await kube.create(f"{RESOURCE}/namespaces/{ns}/resourceclaims", body, dryRun="All")
        except KubeError as error:
            if error.status in (403, 422) and all(word in error.message for word in words):
                return error.message
        return None

    found: str = await wait_for(said, within=within, what=f"a refusal in {ns} saying {words}")
    return found
