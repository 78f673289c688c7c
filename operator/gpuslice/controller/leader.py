"""One controller acts at a time: a Lease in gpuslice's namespace, kept as client-go keeps it.

Two copies of the controller (two replicas, or one on a laptop against the same cluster)
would both converge every policy, probe tenancy and write status, each undoing the other's
records. So a copy acts only while it holds the Lease ``gpuslice-controller`` in its namespace
(the ``namespace`` setting):

- it takes the Lease when it is free, or when its holder has not renewed it for
  ``lease_duration`` as measured on *this* copy's clock from when it last saw the record change
  (never by comparing its clock with another's);
- it renews every ``retry_period``; a copy that cannot renew within ``renew_deadline`` stops
  acting, and so does one whose own clock says the lease ran out (a process that was frozen
  and thawed finds its time gone before it writes anything: :class:`LeaderGuard`);
- on a clean stop it gives the Lease up, so a successor takes over at once;
- every write of the controller, Kopf's own included, is refused unless it holds the Lease
  (:class:`WriteGuard`, a middleware on each of its sessions to the API server).

Writes are optimistic (``resourceVersion``): of two copies taking a free Lease at once, the
API server lets exactly one succeed.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import structlog

from gpuslice.coordinates import lease_path
from gpuslice.dra.names import CONTROLLER_NAMESPACE
from gpuslice.kube.client import Conflict, KubeClient, KubeError, NotFound
from gpuslice.kube.transport import Transport

log = structlog.get_logger(__name__)
LEASE_NAME = "gpuslice-controller"


def identity() -> str:
    """``<host>-<random>``: unique per process, readable in ``kubectl get lease``."""
    return f"{socket.gethostname()}-{uuid.uuid4().hex[:6]}"


def _micro(moment: float) -> str:
    return datetime.datetime.fromtimestamp(moment, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class NotLeader(KubeError):
    """This copy does not hold the Lease (any more): it must not write. Transient: a renewal may
    follow once the API server answers again."""

    transient = True

    def __init__(self) -> None:
        super().__init__(0, "NotLeader", "this controller does not hold the leader Lease (any more); it writes"
                                         " nothing", None)


@dataclass
class LeaderElector:
    kube: KubeClient
    holder: str
    namespace: str = CONTROLLER_NAMESPACE
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    clock: Callable[[], float] = time.monotonic
    # What this copy last saw of the record, and when by its own clock.
    _observed: tuple[str, str, str] | None = None  # (holder, renewTime, resourceVersion)
    _observed_at: float = 0.0
    _renewed_at: float | None = None  # last successful renewal by this copy
    lost: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def path(self) -> str:
        return lease_path(self.namespace, LEASE_NAME)

    def leading(self) -> bool:
        """True while this copy's own clock says its lease holds (renewed less than ``renew_deadline`` ago)."""
        return (self._renewed_at is not None and not self.lost.is_set()
                and self.clock() - self._renewed_at < self.renew_deadline)

    def _body(self, spec: dict[str, Any], version: str | None) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": LEASE_NAME, "namespace": self.namespace}
        if version:
            meta["resourceVersion"] = version
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": spec}

    async def try_acquire_or_renew(self) -> bool:
        now_wall = time.time()
        try:
            lease = await self.kube.get(self.path)
        except NotFound:
            spec: dict[str, Any] = {"holderIdentity": self.holder, "leaseDurationSeconds": int(self.lease_duration),
                    "acquireTime": _micro(now_wall), "renewTime": _micro(now_wall), "leaseTransitions": 0}
            try:
                await self.kube.create(self.path.rsplit("/", 1)[0], self._body(spec, None))
            except Conflict:
                return False  # another copy created it first
            self._renewed_at = self.clock()
            return True
        spec = dict(lease.get("spec") or {})
        record = (str(spec.get("holderIdentity") or ""), str(spec.get("renewTime") or ""),
                  str(lease["metadata"].get("resourceVersion", "")))
        if self._observed is None or record[:2] != self._observed[:2]:
            self._observed, self._observed_at = record, self.clock()
        holder = record[0]
        duration = float(spec.get("leaseDurationSeconds") or self.lease_duration)
        if holder and holder != self.holder and self.clock() - self._observed_at < duration:
            return False  # held, and renewed within its duration as far as we have seen
        if holder != self.holder:
            spec["acquireTime"] = _micro(now_wall)
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
        spec.update({"holderIdentity": self.holder, "leaseDurationSeconds": int(self.lease_duration),
                     "renewTime": _micro(now_wall)})
        try:
            await self.kube.replace(self.path, self._body(spec, record[2]))
        except Conflict:
            return False  # the record moved under us: look again
        self._renewed_at = self.clock()
        return True

    async def attempt(self) -> bool:
        """One :meth:`try_acquire_or_renew`, bounded by ``renew_deadline`` as client-go bounds it:
        a request that hangs (60 s, the client's timeout) would otherwise keep this copy from trying
        again, and from writing, for that long."""
        try:
            return await asyncio.wait_for(self.try_acquire_or_renew(), self.renew_deadline)
        except TimeoutError:
            raise KubeError(0, "Timeout", f"no answer about the Lease within {self.renew_deadline} s",
                            None) from None

    async def acquire(self, stop: asyncio.Event) -> bool:
        """Wait until this copy holds the Lease; False when ``stop`` came first."""
        waiting_logged = False
        while not stop.is_set():
            try:
                if await self.attempt():
                    log.info("leading: this controller acts", holder=self.holder,
                             lease=f"{self.namespace}/{LEASE_NAME}")
                    return True
            except KubeError as error:
                log.warning("the leader Lease could not be read or written; will retry", error=str(error))
            if not waiting_logged and self._observed is not None:
                log.info("another controller leads; waiting", holder=self._observed[0], me=self.holder)
                waiting_logged = True
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.retry_period)
        return False

    async def keep(self, stop: asyncio.Event) -> None:
        """Renew every ``retry_period`` until ``stop``; set ``lost`` once another copy holds the Lease.

        A renewal that fails (the API server unreachable, restarting or refusing) stops this
        copy's writes once ``renew_deadline`` has passed (:meth:`leading` turns False) but not the
        process: when the API server answers again and the Lease is still this copy's, unchanged
        since it last wrote it (the write is optimistic), the renewal succeeds and the copy acts
        again. Only a Lease that changed hands is lost for good."""
        stopped_writing = False
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), self.retry_period)
                return
            except TimeoutError:
                pass
            try:
                renewed = await self.attempt()
            except KubeError as error:
                if not self.leading() and not stopped_writing:
                    log.warning("the leader Lease could not be renewed in time: no writes until it is",
                                holder=self.holder, error=str(error))
                    stopped_writing = True
                continue
            if renewed:
                if stopped_writing:
                    log.info("renewed the leader Lease again: this controller acts", holder=self.holder)
                    stopped_writing = False
                continue
            if self._observed is not None and self._observed[0] not in ("", self.holder):
                break  # another copy holds it now (a conflict alone may be our own lost answer: look again)
        if not stop.is_set():
            log.error("lost the leader Lease: this controller stops acting", holder=self.holder,
                      leader=self._observed[0] if self._observed else None)
            self.lost.set()

    async def release(self) -> None:
        """Give the Lease up (only if this copy still holds it), so a successor need not wait."""
        if self._renewed_at is None:
            return
        try:
            lease = await self.kube.get(self.path)
            spec = dict(lease.get("spec") or {})
            if spec.get("holderIdentity") != self.holder:
                return
            spec.update({"holderIdentity": "", "leaseDurationSeconds": 1, "renewTime": _micro(time.time())})
            await self.kube.replace(self.path, self._body(spec, str(lease["metadata"].get("resourceVersion", ""))))
            log.info("gave up the leader Lease", holder=self.holder)
        except KubeError as error:
            log.warning("could not give up the leader Lease; a successor waits for it to run out", error=str(error))
        self._renewed_at = None


class GuardedClient(KubeClient):
    """The client reconciles write with: it refuses any write once this copy's own clock says its
    Lease may have run out, so a copy that was frozen (SIGSTOP, a VM paused) and thawed finds out
    before its first write, not after."""

    def __init__(self, transport: Transport, elector: LeaderElector, *, timeout: float) -> None:
        super().__init__(transport, timeout=timeout)
        self.elector = elector

    async def request(self, method: str, path: str, body: Any = None, **kwargs: Any) -> dict[str, Any]:
        if method not in ("GET", "HEAD") and not self.elector.leading():
            log.warning("write refused: this controller does not hold the leader Lease", method=method, path=path)
            raise NotLeader()
        return await super().request(method, path, body, **kwargs)


SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


class WriteGuard:
    """Refuses every API write of the controller while it is not the leader, Kopf's own included.

    Kopf writes with its own HTTP session (finalizers, progress annotations, Events), which no
    client of ours wraps; a copy thawed after its Lease ran out could otherwise write one of
    those before its loop notices. So this is an aiohttp client middleware, the first on every
    session the controller opens to the API server (Kopf's, controller.login; its clients',
    kube.transport): a method that writes is refused, before anything else runs or is sent,
    unless this copy leads or the request is about the Lease itself. Sessions that are not the
    controller's to the API server (an oidc token refresh) are not its business.
    """

    def __init__(self, elector: LeaderElector) -> None:
        self.elector = elector

    def allows(self, method: str, url: str) -> bool:
        return (method.upper() in SAFE_METHODS or self.elector.leading()
                or self.elector.path in url)

    async def __call__(self, request: aiohttp.ClientRequest,
                       handler: aiohttp.ClientHandlerType) -> aiohttp.ClientResponse:
        if not self.allows(request.method, str(request.url)):
            log.warning("write refused: this controller does not hold the leader Lease", method=request.method,
                        url=str(request.url))
            raise aiohttp.ClientConnectionError("this controller does not hold the leader Lease: write refused"
                                                " before it was sent")
        return await handler(request)
