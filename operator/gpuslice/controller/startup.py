"""What the controller does once before it watches anything."""

from __future__ import annotations

import json

import kopf
import structlog

from gpuslice.controller.apply import FIELD_MANAGER
from gpuslice.controller.settings import ControllerSettings
from gpuslice.controller.state import Context
from gpuslice.coordinates import SELF_SUBJECT_REVIEWS, admission_policy_path, namespace_path
from gpuslice.dra.names import CONTROLLER_NAMESPACE, TENANCY_JUDGED, TENANCY_LABEL
from gpuslice.dra.support import taint_rule_api
from gpuslice.kube.client import KubeClient, KubeError
from gpuslice.kube.discovery import served_resources
from gpuslice.planning.cluster.admission import ADMIN_LABEL_GUARD

log = structlog.get_logger(__name__)
SERVICE_ACCOUNT = "system:serviceaccount:"


async def whoami(kube: KubeClient) -> str:
    """The controller's own username, as the apiserver sees it."""
    review = await kube.create(SELF_SUBJECT_REVIEWS,
                               {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
    return str(review["status"]["userInfo"]["username"])


def own_namespace(username: str, told: str | None = None) -> str:
    """gpuslice's own namespace: as the `namespace` setting says (the chart and manifests set it
    from the pod), else the ServiceAccount's namespace, else gpuslice-system for any other identity."""
    if told:
        return told
    if username.startswith(SERVICE_ACCOUNT) and username.count(":") == 3:
        return username.split(":")[2]
    return CONTROLLER_NAMESPACE


async def check_label_guard(kube: KubeClient, username: str) -> None:
    """The admin-access label guard (manifests/admission.yaml) must exist and let this identity
    set the label: without it tenants could grant themselves admin access, and with another
    username in it every label this controller sets would be refused."""
    path = admission_policy_path(ADMIN_LABEL_GUARD)
    try:
        guard = await kube.get(path)
    except KubeError as error:
        raise kopf.PermanentError(
            f"the ValidatingAdmissionPolicy {ADMIN_LABEL_GUARD} cannot be read ({error.status} {error.reason}:"
            f" {error.message}); apply manifests/admission.yaml (after crds/ and manifests/controller-rbac.yaml)"
            " before starting the controller") from None
    if f"'{username}'" not in json.dumps(guard.get("spec") or {}):
        raise kopf.PermanentError(
            f"the ValidatingAdmissionPolicy {ADMIN_LABEL_GUARD} does not name this controller's identity"
            f" {username}, so it would refuse every admin-access label the controller sets; replace the"
            " controller's username in manifests/admission.yaml with this one (see docs/controller.md)")


async def start_context(kube: KubeClient, settings: ControllerSettings) -> Context:
    """The reconciles' shared context, on ``kube`` (closed here if the start fails)."""
    try:
        username = await whoami(kube)
        await check_label_guard(kube, username)
        taint_api = taint_rule_api(await served_resources(kube, "resource.k8s.io"))
    except (KubeError, kopf.PermanentError):
        await kube.close()
        raise
    namespace = own_namespace(username, settings.namespace)
    try:
        # Its tenancy probe is judged by gpuslice-tenancy only in a labelled namespace (tenancy_labels);
        # labelled before any policy is probed, so the first probe is not answered by another rule.
        await kube.merge_patch(namespace_path(namespace),
                               {"metadata": {"labels": {TENANCY_LABEL: TENANCY_JUDGED}}})
    except KubeError as error:
        log.warning("could not label the controller's namespace; the converges try again", namespace=namespace,
                    error=str(error))
    log.info("controller started", username=username, namespace=namespace, field_manager=FIELD_MANAGER,
             taint_rule_api=taint_api)
    return Context(kube=kube, username=username, namespace=namespace, taint_rule_api=taint_api,
                   first_retry=settings.first_retry, last_retry=settings.last_retry)
