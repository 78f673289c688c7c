"""Each policy's GpuSliceAgentView (api.agent_view): what the node agents plan from, written by
the controller beside the policy, so that the policy's status, which changes as claims come and
go, reaches no agent. Only for a policy the controller has taken in (its finalizer is on).

The view is worked out from the policy's body on every event of the policy (its spec, its
verdict, its moves in flight, its deletion) and written only when it differs from what the
controller last wrote (or, after a restart, from what its watch of the views holds): a status
refresh that changes only counts changes no view. A write that fails is tried again by the
policy's status timer (every ``--status-interval``). The view goes with its policy.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, MutableMapping
from typing import Any

import structlog

from gpuslice.api.agent_view import view_of, view_path
from gpuslice.api.policy import GROUP
from gpuslice.controller.apply import APPLIED, FIELD_MANAGER, stamped
from gpuslice.kube.client import KubeClient, KubeError, NotFound

log = structlog.get_logger(__name__)
Body = Mapping[str, Any]
# The controller's finalizer (Kopf's, set on every policy it takes in): a view is written only for a
# policy that has it, so a policy created and deleted while the controller was away gets none.
FINALIZER = f"{GROUP}/policy-cleanup"


def written_digest(view: Body) -> str | None:
    """The digest of the manifest the controller last applied to a view (its APPLIED annotation)."""
    return ((view.get("metadata") or {}).get("annotations") or {}).get(APPLIED)


async def sync_view(kube: KubeClient, policy: Body, deleted: bool, written: MutableMapping[str, str],
                    watched: Mapping[str, str | None]) -> bool:
    """Write ``policy``'s view when it differs from what was written (``written``: the controller's
    record of each view's digest; ``watched``: what its watch of the views holds); delete it when the
    policy is gone. True when something was written."""
    name = str(policy["metadata"]["name"])
    if deleted:
        if written.pop(name, None) is None and name not in watched:
            return False  # none was written (a policy deleted before the controller took it in)
        with contextlib.suppress(NotFound):
            await kube.delete(view_path(name))
        return True
    if FINALIZER not in (policy["metadata"].get("finalizers") or []):
        return False  # not taken in yet (the finalizer comes first), or gone before it was
    manifest = stamped(view_of(policy))
    digest = manifest["metadata"]["annotations"][APPLIED]
    if written.get(name, watched.get(name)) == digest:
        return False
    await kube.apply(view_path(name), manifest, field_manager=FIELD_MANAGER)
    written[name] = digest
    log.info("agent view written", policy=name, generation=(manifest["spec"]["policy"] or {}).get("generation"),
             valid=(manifest["spec"].get("valid") or {}).get("status"))
    return True


async def sync_view_quietly(kube: KubeClient, policy: Body, deleted: bool, written: MutableMapping[str, str],
                            watched: Mapping[str, str | None]) -> None:
    """``sync_view``, logging a failure (the policy's status timer tries again)."""
    try:
        await sync_view(kube, policy, deleted, written, watched)
    except KubeError as error:
        log.warning("could not write the policy's agent view; will retry", policy=policy["metadata"]["name"],
                    error=str(error))
