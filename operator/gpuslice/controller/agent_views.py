"""Each policy's GpuSliceAgentView (api.agent_view): what the node agents plan from, written by
the controller beside the policy, so that the policy's status, which changes as claims come and
go, reaches no agent. Only for a policy the controller has taken in (its finalizer is on).

The view is worked out from the policy's body on every event of the policy (its spec, its
verdict, its moves in flight, its deletion) and written only when it differs from what the
controller's watch of the views holds: a status refresh that changes only counts changes no view.
The watch, not a record of what this process wrote, is the judge: a view someone deleted, or one
another leader wrote since, is written again at the policy's next event or status refresh (every
``--status-interval``), as is a write that failed. What this process wrote stands for ECHO seconds
only, while its own write's event may not have reached the watch. The view goes with its policy,
and only its policy's own (by UID): a policy deleted and made again under its name keeps its view.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, MutableMapping

import structlog

from gpuslice.api.agent_view import view_of, view_path
from gpuslice.api.policy import GROUP
from gpuslice.controller.apply import APPLIED, FIELD_MANAGER, stamped
from gpuslice.dra.names import CONTROLLER_NAMESPACE
from gpuslice.jsontypes import Body
from gpuslice.kube.client import Conflict, KubeClient, KubeError, NotFound

log = structlog.get_logger(__name__)
# The controller's finalizer (Kopf's, set on every policy it takes in): a view is written only for a
# policy that has it, so a policy created and deleted while the controller was away gets none.
FINALIZER = f"{GROUP}/policy-cleanup"
ECHO = 5.0  # seconds a view this process wrote stands for its watch's event of it


def written_digest(view: Body) -> str | None:
    """The digest of the manifest the controller last applied to a view (its APPLIED annotation)."""
    return ((view.get("metadata") or {}).get("annotations") or {}).get(APPLIED)


async def sync_view(kube: KubeClient, policy: Body, deleted: bool, written: MutableMapping[str, tuple[str, float]],
                    watched: Mapping[str, str | None], now: float, home: str = CONTROLLER_NAMESPACE) -> bool:
    """Write ``policy``'s view when the watch of the views (``watched``: each view's digest) does not
    hold it, unless this process wrote it less than ECHO seconds ago (``written``: digest and when);
    delete it when the policy is gone. ``home``: gpuslice's namespace, where the views are. True
    when something was written."""
    name = str(policy["metadata"]["name"])
    if deleted:
        if written.pop(name, None) is None and name not in watched:
            return False  # none was written (a policy deleted before the controller took it in)
        await _delete_own(kube, name, str(policy["metadata"].get("uid") or ""), home)
        return True
    if FINALIZER not in (policy["metadata"].get("finalizers") or []):
        return False  # not taken in yet (the finalizer comes first), or gone before it was
    manifest = stamped(view_of(policy, home))
    digest = manifest["metadata"]["annotations"][APPLIED]
    mine = written.get(name)
    if watched.get(name) == digest or (mine is not None and mine[0] == digest and now - mine[1] < ECHO):
        return False
    await kube.apply(view_path(name, home), manifest, field_manager=FIELD_MANAGER)
    written[name] = (digest, now)
    log.info("agent view written", policy=name, generation=(manifest["spec"]["policy"] or {}).get("generation"),
             valid=(manifest["spec"].get("valid") or {}).get("status"))
    return True


async def _delete_own(kube: KubeClient, name: str, uid: str, home: str) -> None:
    """Delete the view of the policy ``uid``, not one a policy made again under its name has since
    (the deleted policy's event may come after the new policy's view was written)."""
    try:
        view = await kube.get(view_path(name, home))
    except NotFound:
        return
    if uid and ((view.get("spec") or {}).get("policy") or {}).get("uid") not in (uid, None, ""):
        return
    with contextlib.suppress(NotFound, Conflict):  # Conflict: replaced since it was read
        await kube.request("DELETE", view_path(name, home), {
            "apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": view["metadata"]["uid"]}})


async def sync_view_quietly(kube: KubeClient, policy: Body, deleted: bool,
                            written: MutableMapping[str, tuple[str, float]], watched: Mapping[str, str | None],
                            now: float, home: str = CONTROLLER_NAMESPACE) -> None:
    """``sync_view``, logging a failure (the policy's status timer tries again)."""
    try:
        await sync_view(kube, policy, deleted, written, watched, now, home)
    except KubeError as error:
        log.warning("could not write the policy's agent view; will retry", policy=policy["metadata"]["name"],
                    error=str(error))
