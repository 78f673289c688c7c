"""The one place that talks to the API server.

We speak plain JSON (dicts) rather than kubernetes_asyncio's generated models:
the models lag the server (resource.k8s.io gains fields every minor) and
silently drop what they do not know, which for ResourceSlices would mean
rewriting a driver's devices without fields the scheduler relies on. The HTTP
session and the credentials are ``transport``'s (kubeconfigs read as kubectl reads
them: ``kubeconfig``).

Every failure is a :class:`KubeError`, typed by what it means to the caller
(:class:`NotFound`, :class:`Conflict`, :class:`Invalid`, :class:`TooManyRequests`,
:class:`ServerError`, :class:`Unreachable`, ...), so ``except KubeError`` also
covers a connection refused or a request that timed out. Transient failures are
retried here, a bounded number of times, when repeating the request cannot do
something twice (see :class:`RetryPolicy`).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, cast

import aiohttp
import structlog

from gpuslice.backoff import Backoff
from gpuslice.jsontypes import Object
from gpuslice.kube import metrics
from gpuslice.kube.transport import ApiError, Transport, connect

# Seconds for one request, connection included: a half-open connection must not hang a
# reconcile (holding its policy's lock) or the agent's publish cycle for good.
REQUEST_TIMEOUT = 60
log = structlog.get_logger(__name__)

# A request that got no answer (refused, dropped, timed out), as the HTTP library raises it. The client
# turns these into Unreachable; code that waits on it from outside catches them by this name, so that
# only the API client knows which HTTP library it uses.
NO_ANSWER: tuple[type[Exception], ...] = (aiohttp.ClientError, TimeoutError, ConnectionError)


# What an admission plugin of k8s.io/apiserver answers before its informers have synced.
NOT_READY = "not yet ready to handle request"


class KubeError(Exception):
    """An API error, with the server's own message (what kubectl would print).

    ``status`` is the HTTP status, or 0 when no answer came (:class:`Unreachable`).
    Catch a subclass for one meaning, or ``KubeError`` for any failure of a request.
    """

    transient: ClassVar[bool] = False  # the same request may well succeed a moment later

    def __init__(self, status: int, reason: str, message: str, body: Object | None,
                 retry_after: float | None = None) -> None:
        super().__init__(f"{status} {reason}: {message}" if status else f"{reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.body = body or {}
        self.retry_after = retry_after  # seconds the server asked us to wait (Retry-After)

    @staticmethod
    def of(status: int, reason: str, message: str, body: Object | None = None,
           retry_after: float | None = None) -> KubeError:
        """The typed error for an HTTP answer."""
        kind: type[KubeError] = _BY_STATUS.get(status, ServerError if status >= 500 else KubeError)
        if status == 409 and reason == "AlreadyExists":
            kind = AlreadyExists
        elif status == 403 and NOT_READY in message:
            kind = NotReady
        return kind(status, reason, message, body, retry_after)

    @classmethod
    def from_api(cls, error: ApiError) -> KubeError:
        try:
            body = json.loads(error.body) if error.body else {}
        except (TypeError, ValueError):
            body = {"message": error.body.decode(errors="replace")}
        if not isinstance(body, dict):
            body = {"message": str(body)}
        headers: Mapping[str, str] = error.headers or {}
        return KubeError.of(int(error.status or 0), str(body.get("reason") or error.reason),
                            str(body.get("message", error.reason)), body, _seconds(headers.get("Retry-After")))


class BadRequest(KubeError):
    """400: the request itself is malformed (a bad selector, an unparsable body)."""


class Unauthorized(KubeError):
    """401: the credentials are missing, wrong or expired."""


class Forbidden(KubeError):
    """403: RBAC, or an admission rule that denies with reason Forbidden."""


class NotReady(Forbidden):
    """403 "not yet ready to handle request": an API server that has just started refuses what
    its admission plugins (ValidatingAdmissionPolicy, webhooks, namespace lifecycle) would judge
    until their informers have synced. It says nothing about the request."""

    transient = True


class NotFound(KubeError):
    """404: the object (or its namespace, or the resource type) does not exist."""

    @property
    def kind(self) -> str:
        """The resource the server found missing (``details.kind``: "nodes", "resourceclaims"), or ""."""
        return str((self.body.get("details") or {}).get("kind") or "")


class Conflict(KubeError):
    """409: a write lost a race (resourceVersion) or the name is taken."""


class AlreadyExists(Conflict):
    """409 AlreadyExists: a create found the name taken."""


class Gone(KubeError):
    """410: a watch or list continuation is too old."""


IMMUTABLE = "field is immutable"  # apimachinery's validation.FieldImmutableErrorMsg


class Invalid(KubeError):
    """422: the object does not validate; ``body['details']['causes']`` names the fields."""

    @property
    def immutable(self) -> bool:
        """Whether it was refused for changing a field that cannot change (the object must be replaced)."""
        causes = (self.body.get("details") or {}).get("causes") or []
        return IMMUTABLE in self.message or any(
            isinstance(c, dict) and IMMUTABLE in str(c.get("message") or "") for c in causes)


class TooManyRequests(KubeError):
    """429: the server is shedding load (priority and fairness, max in flight); ``retry_after`` says when."""

    transient = True


class ServerError(KubeError):
    """5xx: the server failed (etcd unavailable, a timeout inside the server)."""

    transient = True


class Unreachable(KubeError):
    """No answer: the connection was refused or dropped, or the request timed out (status 0)."""

    transient = True

    def __init__(self, status: int = 0, reason: str = "Unreachable", message: str = "", body: Object | None = None,
                 retry_after: float | None = None, *, sent: bool = True) -> None:
        super().__init__(status, reason, message, body, retry_after)
        self.sent = sent  # False only when the connection was never made: the server saw nothing


_BY_STATUS: dict[int, type[KubeError]] = {
    400: BadRequest, 401: Unauthorized, 403: Forbidden, 404: NotFound, 409: Conflict, 410: Gone,
    422: Invalid, 429: TooManyRequests,
}


DISRUPTION_BUDGET_CAUSE = "DisruptionBudget"  # policy/v1 DisruptionBudgetCause
SEVERAL_BUDGETS = "more than one PodDisruptionBudget"  # the Eviction API's 500 for a pod under several


def refused_by_disruption_budget(error: KubeError) -> bool:
    """Whether an eviction was refused for PodDisruptionBudgets: a 429 or a 403 whose causes name
    the budget (the Eviction API's refusals, pkg/registry/core/pod/storage/eviction.go), or the 500
    for a pod under several budgets. A 429 without that cause is the server shedding load (priority
    and fairness): a retry, not a refusal."""
    if isinstance(error, TooManyRequests | Forbidden):
        causes = (error.body.get("details") or {}).get("causes") or []
        # A StatusCause's Type is "reason" on the wire (apimachinery meta/v1 types.go).
        return any(isinstance(c, dict) and c.get("reason") == DISRUPTION_BUDGET_CAUSE for c in causes)
    return isinstance(error, ServerError) and SEVERAL_BUDGETS in error.message


def _seconds(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value else None
    except ValueError:
        return None  # an HTTP date: the default backoff will do


@dataclass(frozen=True)
class RetryPolicy:
    """Which failed requests the client repeats, and for how long.

    A request is repeated only when repeating it cannot do anything twice: when it never
    reached the server (connection refused, 429 from load shedding), or when it is idempotent
    (GET, PUT, DELETE, merge and apply patches) and failed transiently (dropped connection,
    timeout, 5xx). A create is never repeated after it may have been sent, unless the caller
    says it is safe (``idempotent=True``: a named object whose repeat gives AlreadyExists).
    Bounded by ``attempts`` and by ``budget`` seconds from the first try, so callers with
    their own loop (the agent's cycle, Kopf's retries) get the error back soon.
    """

    attempts: int = 5
    budget: float = 10.0
    first_delay: float = 0.2
    max_delay: float = 2.0

    def delay(self, attempt: int, error: KubeError) -> float:
        backoff = Backoff(self.first_delay, self.max_delay).after(attempt)
        return float(max(backoff, min(error.retry_after or 0.0, 2 * self.max_delay)))


NO_RETRY = RetryPolicy(attempts=1)


@dataclass(frozen=True)
class EndlessBackoff:
    """For Kopf's ``settings.networking.error_backoffs``: retry an unreachable API server forever,
    waiting ``steps`` then ``cap`` seconds between tries. Kopf's default gives up after 8 tries
    (54 s) and its watches then restart on their own schedule; with this, a watch is back within
    ``cap`` seconds of the API server, however long it was away."""

    steps: tuple[float, ...] = (0.5, 1.0, 2.0, 3.0)
    cap: float = 5.0

    def __iter__(self) -> Iterator[float]:
        return itertools.chain(self.steps, itertools.repeat(self.cap))
_IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})
_IDEMPOTENT_PATCHES = frozenset({"application/merge-patch+json", "application/apply-patch+yaml"})


def _unreachable(error: BaseException, sent: bool) -> Unreachable:
    what = "timed out" if isinstance(error, TimeoutError) else f"{type(error).__name__}: {error}"
    return Unreachable(message=f"no answer from the API server ({what})", sent=sent)


class KubeClient:
    """A small async JSON client; create with :meth:`from_kubeconfig` and close when done."""

    def __init__(self, transport: Transport, *, timeout: float = REQUEST_TIMEOUT,
                 retry: RetryPolicy = RetryPolicy(), namespace: str = "default") -> None:
        self.transport = transport
        self.timeout = timeout
        self.retry = retry
        self.namespace = namespace  # the context's (or the pod's) namespace: what kubectl defaults to

    @classmethod
    async def from_kubeconfig(cls, path: Path | str | None = None, *, context: str | None = None,
                              pod_first: bool = True, request_timeout: float = REQUEST_TIMEOUT,
                              retry: RetryPolicy = RetryPolicy()) -> KubeClient:
        """From ``path`` and ``context``; without a path, the pod's ServiceAccount, then $KUBECONFIG or
        ~/.kube/config (``pod_first=False``: kubectl's order, the pod's ServiceAccount last)."""
        transport = await connect(path, context, pod_first=pod_first)
        return cls(transport, timeout=request_timeout, retry=retry, namespace=transport.namespace)

    async def close(self) -> None:
        await self.transport.close()

    async def __aenter__(self) -> KubeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        query: Mapping[str, str | int | bool] | None = None,
        content_type: str = "application/json",
        accept: str = "application/json",
        idempotent: bool | None = None,
        retry: RetryPolicy | None = None,
    ) -> Object:
        """One API request, repeated on transient failures as :class:`RetryPolicy` allows (``retry``,
        else the client's).

        ``idempotent`` overrides what the method and content type say (see RetryPolicy).
        """
        policy = retry or self.retry
        if idempotent is None:
            idempotent = method in _IDEMPOTENT_METHODS or (method == "PATCH" and content_type in _IDEMPOTENT_PATCHES)
        started = time.monotonic()
        attempt = 0
        while True:
            attempt += 1
            try:
                return await self._once(method, path, body, query, content_type, accept)
            except KubeError as error:
                unsent = isinstance(error, Unreachable) and not error.sent
                repeatable = isinstance(error, TooManyRequests) or unsent or (error.transient and idempotent)
                delay = policy.delay(attempt, error)
                if (not repeatable or attempt >= policy.attempts
                        or time.monotonic() + delay - started > policy.budget):
                    raise
                log.debug("API request failed; retrying", method=method, path=path, error=str(error),
                          attempt=attempt, retry_in=round(delay, 2))
                await asyncio.sleep(delay)

    async def _once(self, method: str, path: str, body: Any, query: Mapping[str, str | int | bool] | None,
                    content_type: str, accept: str) -> Object:
        status: int | None = None
        try:
            result = await self.transport.request(method, path, body, query or {}, content_type, accept, self.timeout)
            status = 200
        except ApiError as error:
            status = error.status
            raise KubeError.from_api(error) from None
        except aiohttp.ClientConnectorError as error:  # never reached the server: nothing was sent
            raise _unreachable(error, sent=False) from error
        except NO_ANSWER as error:
            raise _unreachable(error, sent=True) from error
        finally:
            metrics.count(method, path, content_type, dict(query or {}), status)
        return cast(Object, result or {})

    async def get(self, path: str, **query: str | int | bool) -> Object:
        return await self.request("GET", path, query=query)

    async def list(self, path: str, **query: str | int | bool) -> list[Object]:
        return cast(list[Object], (await self.get(path, **query)).get("items", []))

    async def create(self, path: str, body: Object, *, idempotent: bool = False, retry: RetryPolicy | None = None,
                     **query: str | int | bool) -> Object:
        """POST; ``idempotent=True`` when a repeat is harmless (a named object: AlreadyExists); ``retry``
        in place of the client's (``NO_RETRY`` for an eviction: a budget's 429 is an answer)."""
        return await self.request("POST", path, body, query=query, idempotent=idempotent, retry=retry)

    async def replace(self, path: str, body: Object) -> Object:
        return await self.request("PUT", path, body)

    async def merge_patch(self, path: str, patch: Object) -> Object:
        return await self.request("PATCH", path, patch, content_type="application/merge-patch+json")

    async def apply(self, path: str, body: Object, *, field_manager: str, force: bool = True,
                    dry_run: bool = False) -> Object:
        """Server-side apply: ``body`` is the whole intent of ``field_manager``.

        With ``dry_run`` the server validates and admits the result (every admission rule
        runs) but stores nothing.
        """
        query: dict[str, str | int | bool] = {"fieldManager": field_manager, "force": force}
        if dry_run:
            query["dryRun"] = "All"
        return await self.request("PATCH", path, body, query=query, content_type="application/apply-patch+yaml")

    async def delete(self, path: str, **query: str | int | bool) -> Object:
        return await self.request("DELETE", path, query=query)
