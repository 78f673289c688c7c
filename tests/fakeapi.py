"""A small API server for fast tests of the code that talks to one: the agent's publish cycle, the
kubelet plugin's prepare, the controller's converge.

It serves, over real HTTP on loopback and to gpuslice's own ``KubeClient``, the few semantics that
code relies on, and nothing else:

- objects by path, cluster-scoped or namespaced (``/api/v1/...``, ``/apis/<group>/<version>/...``),
  each given a ``uid``, a ``creationTimestamp`` and a ``resourceVersion`` that every write bumps;
  ``metadata.generation`` counts changes of ``spec``;
- lists across one namespace or all, with the list's ``resourceVersion``, pages (``limit``,
  ``continue``), label selectors (``k=v``, ``k!=v``, ``k``, ``!k``, ``k in (..)``, ``k notin (..)``)
  and the field selectors the real server supports for the kinds gpuslice selects (any other is a
  400, as there);
- create (``generateName`` too; 409 AlreadyExists), replace (409 on a stale resourceVersion),
  merge patch (RFC 7386), server-side apply as create-or-replace (one field manager owns the whole
  object, which is how gpuslice applies), delete (404 when absent; an object with finalizers only
  gets its ``deletionTimestamp``), and the ``status`` subresource, which main-resource writes leave
  alone;
- ``dryRun=All`` on every write: judged like the write, stored never;
- admission, as the test configures it (:meth:`FakeApi.admit`: a function of the request and the
  object it would store that may refuse it), a feature gate that is off (:meth:`FakeApi.drop`: a
  field of a kind taken away on every write, without an error, as ``dropDisabledFields`` does), and
  faults on cue (:meth:`FakeApi.fail`: a 404, 409,
  422, 503 ... for the next N requests that match);
- every request recorded (:attr:`FakeApi.requests`), so a test can say what was written, or that
  nothing was.

What it is not: no watches (a watch is refused with 400), no defaulting, no validation of shapes,
no garbage collection, no field managers beyond "the applier owns it all", no admission but what a
test adds. Those semantics are the cluster tier's (a real kube-apiserver). kmock (Kopf's
emulator) was the other candidate; it has none of resourceVersion, selectors, PUT, server-side
apply or dry runs (research/kopf-kmock.md, 3.5), each of which the code under test relies on, and
each would have been a reaction written here anyway.
"""

from __future__ import annotations

import copy
import itertools
import json
import re
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from gpuslice.kube.client import KubeClient, RetryPolicy
from gpuslice.kube.credentials import Credentials
from gpuslice.kube.paths import object_path
from gpuslice.kube.transport import AiohttpTransport

Object = dict[str, Any]
CREATED = "2026-12-01T10:00:00Z"
# Kinds whose status is a subresource: writes of the main resource leave it as it was.
STATUS_SUBRESOURCE = frozenset({"gpuslicepolicies", "resourceclaims", "nodes", "namespaces", "resourcequotas"})
# Field selectors the real server supports, beyond metadata.name and metadata.namespace (every kind).
FIELD_LABELS: dict[str, frozenset[str]] = {
    "resourceslices": frozenset({"spec.nodeName", "spec.driver", "spec.pool.name"}),
    "nodes": frozenset({"spec.unschedulable"}),
    "events": frozenset({"involvedObject.name", "involvedObject.kind", "involvedObject.uid", "reason", "type"}),
}
NAMESPACE_SUBRESOURCES = frozenset({"status", "finalize"})
# The client's own retries, bounded and quick: a fault on cue is seen at once.
QUICK = RetryPolicy(attempts=2, first_delay=0.01, budget=1.0)


@dataclass(frozen=True)
class Request:
    """One request as the server saw it."""

    method: str
    path: str
    query: dict[str, str]
    body: Any
    content_type: str
    text: str = field(default="", repr=False, compare=False)

    def fresh_body(self) -> Any:
        """The body parsed anew: the server's own copy to change, the recorded one left as it came."""
        return json.loads(self.text) if self.text else {}

    @property
    def dry_run(self) -> bool:
        return self.query.get("dryRun") == "All"

    @property
    def write(self) -> bool:
        """A request that changes what is stored (or would, had it succeeded)."""
        return self.method != "GET" and not self.dry_run

    @property
    def apply(self) -> bool:
        return self.method == "PATCH" and self.content_type == "application/apply-patch+yaml"

    def __str__(self) -> str:
        query = "&".join(f"{k}={v}" for k, v in sorted(self.query.items()))
        return f"{self.method} {self.path}{'?' + query if query else ''}"


@dataclass(frozen=True)
class Refusal:
    """What the server answers instead of serving: a Status with ``code``, ``reason``, ``message``
    and, for a 422, the fields at fault (``details.causes``)."""

    code: int
    message: str
    reason: str = ""
    causes: tuple[dict[str, str], ...] = ()

    def status(self) -> Object:
        reason = self.reason or {400: "BadRequest", 403: "Forbidden", 404: "NotFound", 409: "Conflict",
                                 405: "MethodNotAllowed", 410: "Expired", 415: "UnsupportedMediaType", 422: "Invalid", 429: "TooManyRequests",
                                 500: "InternalError", 503: "ServiceUnavailable"}.get(self.code, "Unknown")
        body: Object = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                        "message": self.message, "reason": reason, "code": self.code}
        if self.causes:
            body["details"] = {"causes": list(self.causes)}
        return body


# Admission: the request and the object it would store (None for a delete); a Refusal to refuse it.
Admission = Callable[[Request, Object | None], Refusal | None]


@dataclass
class Cue:
    """A fault served instead of the answer to the next ``times`` matching requests (None: all)."""

    method: str
    path: re.Pattern[str]
    refusal: Refusal
    times: int | None
    dry_run: bool | None
    when: Callable[[Request], bool] | None

    def matches(self, request: Request) -> bool:
        return ((self.method in ("*", request.method)) and self.path.fullmatch(request.path) is not None
                and (self.dry_run is None or self.dry_run == request.dry_run)
                and (self.when is None or self.when(request)))


@dataclass(frozen=True)
class Where:
    """A path taken apart: ``prefix`` (/api/v1 or /apis/g/v), namespace, plural, name, subresource."""

    prefix: str
    plural: str
    namespace: str | None = None
    name: str | None = None
    sub: str | None = None

    @classmethod
    def parse(cls, path: str) -> Where | None:
        parts = [p for p in path.split("/") if p]
        if parts[:2] == ["api", "v1"]:
            prefix, rest = "/api/v1", parts[2:]
        elif parts[:1] == ["apis"] and len(parts) >= 3:
            prefix, rest = "/" + "/".join(parts[:3]), parts[3:]
        else:
            return None
        if len(rest) >= 3 and rest[0] == "namespaces" and not (len(rest) == 3 and rest[2] in NAMESPACE_SUBRESOURCES):
            namespace, rest = rest[1], rest[2:]
        else:
            namespace = None
        if not rest or len(rest) > 3:
            return None
        return cls(prefix, rest[0], namespace, *[*rest[1:], None, None][:2])

    @property
    def key(self) -> tuple[str, str, str, str]:
        assert self.name is not None
        return (self.prefix, self.plural, self.namespace or "", self.name)

    @property
    def kind_path(self) -> str:
        """The collection, for messages: ``resourceslices`` or ``namespaces/ns/configmaps``."""
        return f"{self.plural}" if self.namespace is None else f"namespaces/{self.namespace}/{self.plural}"


class FakeApi:
    """The server's state and behaviour; :meth:`serving` runs it, :meth:`client` talks to it."""

    def __init__(self) -> None:
        self.url = ""
        self.reset()

    def reset(self) -> None:
        """Forget every object, request, rule and cue: a new server at the same address."""
        self.store: dict[tuple[str, str, str, str], Object] = {}
        self.requests: list[Request] = []
        self.cues: list[Cue] = []
        self.admission: list[Admission] = []
        self.dropped: list[tuple[str, tuple[str, ...]]] = []  # (plural, path of keys) taken away on writes
        self._version = itertools.count(100)
        self._names = itertools.count(1)

    # Set-up and inspection (no HTTP: the test's own hands on the server's state)

    def put(self, *objects: Object, path: str | None = None) -> None:
        """Store objects as they are (metadata filled in as on create), whatever admission says."""
        for obj in objects:
            where = Where.parse(path or object_path(obj))
            assert where is not None, f"not an API path: {path or object_path(obj)}"
            assert where.name is not None, f"not an object's path: {path or object_path(obj)}"
            stored = _copy(obj)
            meta = stored.setdefault("metadata", {})
            meta.setdefault("uid", f"uid-{where.name}")
            meta.setdefault("creationTimestamp", CREATED)
            if "spec" in stored:
                meta.setdefault("generation", 1)
            meta["resourceVersion"] = str(next(self._version))
            self.store[where.key] = stored

    def get(self, path: str) -> Object | None:
        """The stored object at ``path`` (a copy), or None."""
        where = Where.parse(path)
        found = self.store.get(where.key) if where is not None and where.name else None
        return _copy(found) if found is not None else None

    def remove(self, path: str) -> None:
        where = Where.parse(path)
        assert where is not None
        assert where.name is not None
        self.store.pop(where.key, None)

    def items(self, path: str) -> list[Object]:
        """The stored objects of the collection at ``path`` (every namespace when it names none)."""
        where = Where.parse(path)
        assert where is not None
        assert where.name is None, f"not a collection: {path}"
        return [_copy(o) for k, o in sorted(self.store.items()) if self._in(k, where)]

    def writes(self, since: int = 0) -> list[Request]:
        """The requests that changed (or tried to change) something, from request number ``since``."""
        return [r for r in self.requests[since:] if r.write]

    def admit(self, rule: Admission) -> None:
        """Judge every write, dry runs included, with ``rule`` too."""
        self.admission.append(rule)

    def drop(self, plural: str, path: str) -> None:
        """Take the field at the dotted ``path`` (e.g. ``spec.extendedResourceName``) out of every
        ``plural`` written, dry runs included, and answer with what is left: a gate that is off."""
        self.dropped.append((plural, tuple(path.split("."))))

    def fail(self, method: str, path: str, code: int, message: str = "", *, reason: str = "", times: int | None = 1,
             dry_run: bool | None = None, causes: Iterable[dict[str, str]] = (),
             when: Callable[[Request], bool] | None = None) -> Cue:
        """Answer the next ``times`` requests (None: every one) of ``method`` ("*": any) whose path
        matches the regular expression ``path`` with ``code``, before anything else is done."""
        cue = Cue(method, re.compile(path), Refusal(code, message or f"injected {code}", reason, tuple(causes)),
                  times, dry_run, when)
        self.cues.append(cue)
        return cue

    # Serving

    @asynccontextmanager
    async def serving(self) -> AsyncIterator[FakeApi]:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        try:
            yield self
        finally:
            await runner.cleanup()

    def client(self, retry: RetryPolicy | None = None) -> KubeClient:
        """gpuslice's own client, pointed at this server, with quick retries (``QUICK``)."""
        return KubeClient(AiohttpTransport(Credentials(server=self.url)), timeout=5, retry=retry or QUICK)

    async def _handle(self, http: web.Request) -> web.Response:
        text = await http.text()
        request = Request(http.method, http.path, dict(http.query), json.loads(text) if text else None,
                          http.content_type, text)
        self.requests.append(request)
        try:
            return web.json_response(self._serve(request))
        except _Refused as refused:
            return web.json_response(refused.refusal.status(), status=refused.refusal.code)

    def _serve(self, request: Request) -> Object:
        for cue in self.cues:
            if cue.matches(request) and cue.times != 0:
                if cue.times is not None:
                    cue.times -= 1
                raise _Refused(cue.refusal)
        where = Where.parse(request.path)
        if where is None:
            raise _Refused(Refusal(404, f"the server could not find the requested resource ({request.path})"))
        if request.query.get("watch") in ("true", "1"):
            raise _Refused(Refusal(400, "the fake API server serves no watches (the cluster tier does)"))
        if where.name is None:
            if request.method == "GET":
                return self._list(where, request.query)
            if request.method == "POST":
                return self._write(request, where, None)
            raise _Refused(Refusal(405, f"{request.method} of a collection is not served"))
        if request.method == "GET":
            found = self.store.get(where.key)
            if found is None:
                raise _Refused(_not_found(where))
            return found  # serialized before anything can change it
        if request.method in ("PUT", "PATCH", "DELETE"):
            return self._write(request, where, self.store.get(where.key))
        raise _Refused(Refusal(405, f"{request.method} is not served"))

    # Reads

    @staticmethod
    def _in(key: tuple[str, str, str, str], where: Where) -> bool:
        return key[:2] == (where.prefix, where.plural) and (where.namespace is None or key[2] == where.namespace)

    def _list(self, where: Where, query: dict[str, str]) -> Object:
        labels = _label_selector(query.get("labelSelector", ""))
        fields = _field_selector(where.plural, query.get("fieldSelector", ""))
        found = [o for k, o in sorted(self.store.items()) if self._in(k, where) and labels(o) and fields(o)]
        start = int(query.get("continue") or 0)
        limit = int(query.get("limit") or 0)
        page = found[start:start + limit] if limit else found[start:]
        more = bool(limit) and start + limit < len(found)
        meta = {"resourceVersion": str(next(self._version))}
        if more:
            meta["continue"] = str(start + limit)
        return {"kind": "List", "apiVersion": "v1", "metadata": meta, "items": page}

    # Writes

    def _write(self, request: Request, where: Where, live: Object | None) -> Object:
        if request.method == "POST":
            after, where = self._created(request, where)
        elif request.method == "DELETE":
            if live is None:
                raise _Refused(_not_found(where))
            after = None
        else:
            after = self._updated(request, where, live)
        for plural, keys in self.dropped:
            parent = after if plural == where.plural else None
            for key in keys[:-1]:
                parent = parent.get(key) if isinstance(parent, dict) else None
            if isinstance(parent, dict):
                parent.pop(keys[-1], None)
        for rule in self.admission:
            refusal = rule(request, after)  # rules only read
            if refusal is not None:
                raise _Refused(refusal)
        if request.method == "DELETE":
            assert live is not None
            if request.dry_run:
                return live
            if live["metadata"].get("finalizers"):
                live["metadata"].setdefault("deletionTimestamp", CREATED)
                live["metadata"]["resourceVersion"] = str(next(self._version))
                return live
            del self.store[where.key]
            return live
        assert after is not None
        if request.dry_run:
            return after
        after["metadata"]["resourceVersion"] = str(next(self._version))
        self.store[where.key] = after
        return after

    def _created(self, request: Request, where: Where, body: Object | None = None) -> tuple[Object, Where]:
        body = body if body is not None else request.fresh_body()
        meta = body.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = f"{meta['generateName']}{next(self._names):05d}"
        if not meta.get("name"):
            raise _Refused(Refusal(422, f"{where.plural} is invalid: metadata.name: Required value",
                                   causes=({"field": "metadata.name", "reason": "FieldValueRequired"},)))
        where = Where(where.prefix, where.plural, where.namespace, meta["name"])
        if where.key in self.store:
            raise _Refused(Refusal(409, f'{where.plural} "{meta["name"]}" already exists', "AlreadyExists"))
        if where.namespace is not None:
            meta["namespace"] = where.namespace
        meta.update(uid=f"uid-{meta['name']}-{next(self._names)}", creationTimestamp=CREATED)
        if "spec" in body:
            meta["generation"] = 1
        return body, where

    def _updated(self, request: Request, where: Where, live: Object | None) -> Object:
        body = request.fresh_body()
        if request.apply and live is None and where.sub is None:
            created, _ = self._created(request, Where(where.prefix, where.plural, where.namespace), body)
            return created
        if live is None:
            raise _Refused(_not_found(where))
        wanted = (body.get("metadata") or {}).get("resourceVersion")
        if wanted and wanted != live["metadata"]["resourceVersion"]:
            raise _Refused(Refusal(409, f'Operation cannot be fulfilled on {where.plural} "{where.name}": the object'
                                        " has been modified; please apply your changes to the latest version and"
                                        " try again", "Conflict"))
        if request.method == "PATCH" and not request.apply:
            if request.content_type != "application/merge-patch+json":
                raise _Refused(Refusal(415, f"the fake API server serves no {request.content_type} patches"))
            after = _copy(_merge(live, body))  # its own, not sharing parts with what is stored
        else:  # PUT, or apply: the body is the whole object
            after = body
        meta = after.setdefault("metadata", {})
        for kept in ("uid", "creationTimestamp", "generation", "deletionTimestamp", "namespace"):
            if kept in live["metadata"]:
                meta[kept] = live["metadata"][kept]
            else:
                meta.pop(kept, None)
        meta["name"] = where.name
        if where.sub == "status":
            return {**_copy(live), "status": after.get("status")}
        if where.plural in STATUS_SUBRESOURCE:
            after.pop("status", None)
            if "status" in live:
                after["status"] = live["status"]
        if "spec" in after and after.get("spec") != live.get("spec"):
            meta["generation"] = int(live["metadata"].get("generation") or 0) + 1
        return dict(after)


class _Refused(Exception):
    def __init__(self, refusal: Refusal) -> None:
        super().__init__(refusal.message)
        self.refusal = refusal


def _copy(obj: Object) -> Object:
    """A deep copy of JSON (several times faster than copy.deepcopy)."""
    copied: Object = json.loads(json.dumps(obj))
    return copied


def _not_found(where: Where) -> Refusal:
    return Refusal(404, f'{where.plural} "{where.name}" not found')


def _merge(target: Any, patch: Any) -> Any:
    """RFC 7386: maps merge, null removes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    merged = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = _merge(merged.get(key), value)
    return merged


def _split(selector: str) -> list[str]:
    """Terms at the top-level commas (not those inside ``in (a,b)``)."""
    terms, depth, current = [], 0, ""
    for char in selector:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            terms.append(current.strip())
            current = ""
        else:
            current += char
    if current.strip():
        terms.append(current.strip())
    return terms


@dataclass(frozen=True)
class _Requirement:
    """One term of a label selector: ``op`` is one of =, !=, in, notin, exists, !exists."""

    key: str
    op: str
    values: frozenset[str] = frozenset()

    def __call__(self, labels: dict[str, str]) -> bool:
        value = labels.get(self.key)
        return {"=": value in self.values, "!=": value not in self.values, "in": value in self.values,
                "notin": value not in self.values, "exists": value is not None,
                "!exists": value is None}[self.op]


def _label_selector(selector: str) -> Callable[[Object], bool]:
    found: list[_Requirement] = []
    for term in _split(selector):
        if m := re.fullmatch(r"([\w./-]+)\s+(in|notin)\s+\(([^)]*)\)", term):
            found.append(_Requirement(m.group(1), m.group(2), frozenset(v.strip() for v in m.group(3).split(","))))
        elif m := re.fullmatch(r"([\w./-]+)\s*(!=|==|=)\s*([\w./-]*)", term):
            found.append(_Requirement(m.group(1), "!=" if m.group(2) == "!=" else "=", frozenset({m.group(3)})))
        elif m := re.fullmatch(r"(!?)([\w./-]+)", term):
            found.append(_Requirement(m.group(2), "!exists" if m.group(1) else "exists"))
        else:
            raise _Refused(Refusal(400, f"unable to parse requirement: {term!r}"))
    return lambda obj: all(r((obj.get("metadata") or {}).get("labels") or {}) for r in found)


def _field(obj: Object, path: str) -> str:
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return "" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def _field_selector(plural: str, selector: str) -> Callable[[Object], bool]:
    terms: list[tuple[str, str, str]] = []
    for term in _split(selector):
        m = re.fullmatch(r"([\w.]+)\s*(!=|==|=)\s*(.*)", term)
        if m is None:
            raise _Refused(Refusal(400, f"invalid field selector: {term!r}"))
        name, op, value = m.groups()
        if name not in {"metadata.name", "metadata.namespace"} | FIELD_LABELS.get(plural, frozenset()):
            raise _Refused(Refusal(400, f'field label not supported: "{name}"'))
        terms.append((name, op, value))
    return lambda obj: all((_field(obj, name) == value) == (op != "!=") for name, op, value in terms)

