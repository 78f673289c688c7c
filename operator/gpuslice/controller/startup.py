"""What the controller does once before it watches anything."""

from __future__ import annotations

import structlog

from gpuslice.controller.apply import FIELD_MANAGER, apply_object
from gpuslice.controller.reconcile import Context
from gpuslice.kube.client import KubeClient, KubeError
from gpuslice.kube.discovery import served_resources
from gpuslice.planning.cluster_objects import admin_access_guard, admin_access_guard_binding

log = structlog.get_logger(__name__)


async def whoami(kube: KubeClient) -> str:
    """The controller's own username, as the apiserver sees it."""
    review = await kube.create("/apis/authentication.k8s.io/v1/selfsubjectreviews",
                               {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
    return str(review["status"]["userInfo"]["username"])


async def start_context(kubeconfig: str | None) -> Context:
    kube = await KubeClient.from_kubeconfig(kubeconfig)
    try:
        username = await whoami(kube)
        served = await served_resources(kube, "resource.k8s.io")
        taint_api = next((f"resource.k8s.io/{v}" for v in ("v1", "v1beta2") if "devicetaintrules" in served.get(v, [])),
                         "resource.k8s.io/v1")
        # Only this identity may turn on a namespace's admin-access label from now on.
        for manifest in (admin_access_guard(username), admin_access_guard_binding()):
            await apply_object(kube, manifest, None)
    except KubeError:
        await kube.close()
        raise
    log.info("controller started", username=username, field_manager=FIELD_MANAGER, taint_rule_api=taint_api)
    return Context(kube=kube, username=username, taint_rule_api=taint_api)
