"""The GpuSlicePolicy CRD: the controller runs Kopf only while the API server serves it.

Kopf (scanning off: the controller may not list CRDs) serves the resources that exist when it
starts, idles without a word when one does not, and when one disappears under it its watch gets
404 and Kopf fails without stopping (its streams do not cancel), until its exit timer kills the
process. A GitOps prune or an uninstall in the wrong order deletes the CRD while the controller
runs, and a controller that exits on it crash-loops. So:

- at start, and whenever the CRD is missing, not yet established, or being deleted, the
  controller waits for it, says why, and asks again with backoff; meanwhile it takes the tenancy
  label off every namespace but its own (controller.tenancy_labels): no policy names any, and a
  labelled namespace routes its claims to the tenancy rule, whose parameter kind is going;
- while it runs, a watch of the CRD alone tells it (no request while the CRD stays served);
- a CRD being deleted first deletes every policy, which the controller finalizes as usual; once
  none is left it stops Kopf before the API server removes the CRD (it does so within seconds of
  the last policy going), and goes back to waiting. A CRD deleted with no policy left goes at once:
  Kopf may then fail first, and the process exits after ``--shutdown-grace``; started again, it
  waits for its CRD (one restart, not a loop).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from gpuslice.api.policy import GROUP, PLURAL
from gpuslice.backoff import Backoff, spread
from gpuslice.coordinates import CRDS, GPUSLICE, POLICIES, crd_path, group_version_path
from gpuslice.kube.client import Forbidden, KubeClient, KubeError, NotFound
from gpuslice.kube.watch import watch

log = structlog.get_logger(__name__)
CRD_NAME = f"{PLURAL}.{GROUP}"
CRD_PATH = crd_path(CRD_NAME)
FIX = "apply crds/ (kubectl apply --server-side -f crds/, or the install that carries it)"


class CrdState(enum.Enum):
    SERVED = "served"
    LEAVING = "being deleted"
    MISSING = "not served"


async def crd_state(kube: KubeClient) -> CrdState:
    """The CRD as the API server has it: established and not being deleted is SERVED. Without the
    permission to read it (an older RBAC during an upgrade) discovery says served or missing."""
    try:
        crd = await kube.get(CRD_PATH)
    except NotFound:
        return CrdState.MISSING
    except Forbidden:
        try:
            listing = await kube.get(group_version_path(GPUSLICE))
        except NotFound:
            return CrdState.MISSING
        return CrdState.SERVED if any(r.get("name") == PLURAL for r in listing.get("resources") or []) else (
            CrdState.MISSING)
    return state_of(crd)


async def _sleep_or_stop(stop: asyncio.Event, seconds: float) -> bool:
    """Sleep ``seconds``; True when ``stop`` was set meanwhile."""
    try:
        await asyncio.wait_for(stop.wait(), seconds)
    except TimeoutError:
        return False
    return True


async def wait_for_crd(kube: KubeClient, stop: asyncio.Event, while_missing: Callable[[], Awaitable[None]], *,
                       first: float = 1.0, cap: float = 30.0) -> bool:
    """Until the CRD is served (True) or ``stop`` is set (False). ``while_missing`` runs each time
    the controller asks and the CRD is not served. Asks again after ``first`` seconds, doubling to
    ``cap``, each half either way at random (a restarted API server is not asked by every
    controller at once)."""
    backoff, said = Backoff(first, cap), None
    while not stop.is_set():
        try:
            state = await crd_state(kube)
            if state is CrdState.SERVED:
                if said is not None:
                    log.info("GpuSlicePolicy CRD served: starting", crd=CRD_NAME)
                return True
            if said is not state:
                log.warning(f"the GpuSlicePolicy CRD is {state.value}: waiting for it, nothing is reconciled"
                            " meanwhile", crd=CRD_NAME, fix=FIX)
                said = state
            await while_missing()
        except KubeError as error:
            log.warning("could not ask whether the GpuSlicePolicy CRD is served; asking again", error=str(error))
        if await _sleep_or_stop(stop, backoff.next()):
            break
    return False


async def no_policy_left(kube: KubeClient) -> bool:
    return not (await kube.get(POLICIES, limit=1)).get("items")


async def until_crd_leaves(kube: KubeClient, leaving: asyncio.Event, interval: float) -> None:
    """Set ``leaving`` once the CRD is gone, or being deleted with no policy left. Told by a watch of
    the CRD alone (``metadata.name``, selected by the API server): a CRD that stays served costs no
    request. Asked every ``interval`` seconds (jittered) only while the CRD is being deleted with
    policies left (the policies' deletion handler asks as soon as the last one goes; this is in case
    that answer failed), or where the RBAC grants no watch of it (an install before this version).
    A failed question is no answer."""
    stop, wake = asyncio.Event(), asyncio.Event()
    seen = _Seen()

    def on_error(error: BaseException) -> None:
        if isinstance(error, Forbidden):
            seen.forbidden = True
            stop.set()
        wake.set()

    def on_listed() -> None:
        seen.listed()
        wake.set()

    def handler(kind: str | None, body: dict[str, Any]) -> None:
        seen.event(kind, body)
        if kind is not None:
            wake.set()

    watcher = asyncio.create_task(watch(kube, CRDS, handler, stop, query={"fieldSelector": f"metadata.name={CRD_NAME}"},
                                        on_error=on_error, on_listed=on_listed))
    try:
        while not leaving.is_set():
            polling = seen.forbidden or seen.state is CrdState.LEAVING
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), spread(interval) if polling else None)
            wake.clear()
            if not seen.forbidden and seen.state is CrdState.SERVED:
                continue
            try:
                if await crd_leaving(kube):
                    leaving.set()
            except KubeError:
                continue
    finally:
        stop.set()
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher


class _Seen:
    """What the CRD's watch said last: its state (None before the first list), and whether the
    watch is forbidden (the controller's RBAC predates it)."""

    def __init__(self) -> None:
        self.state: CrdState | None = None
        self.forbidden = False
        self._in_list = False

    def event(self, kind: str | None, body: dict[str, Any]) -> None:
        self._in_list |= kind is None
        self.state = CrdState.MISSING if kind == "DELETED" else state_of(body)

    def listed(self) -> None:
        if not self._in_list:
            self.state = CrdState.MISSING  # listed by its name, and not there
        self._in_list = False


def state_of(crd: dict[str, Any]) -> CrdState:
    """The CRD's state from its body: established and not being deleted is SERVED."""
    if (crd.get("metadata") or {}).get("deletionTimestamp"):
        return CrdState.LEAVING
    established = any(c.get("type") == "Established" and c.get("status") == "True"
                      for c in (crd.get("status") or {}).get("conditions") or [])
    return CrdState.SERVED if established else CrdState.MISSING


async def crd_leaving(kube: KubeClient) -> bool:
    """Whether Kopf must stop now: the CRD gone, or being deleted with every policy gone already
    (the API server removes it within seconds then, and Kopf must not see that)."""
    state = await crd_state(kube)
    if (state is CrdState.LEAVING and not await no_policy_left(kube)) or state is CrdState.SERVED:
        return False
    log.warning(f"the GpuSlicePolicy CRD is {state.value}: stopping Kopf and waiting for it", crd=CRD_NAME,
                fix=FIX)
    return True
