"""Make the cluster hold exactly a policy's desired objects, writing only what differs.

Each kind's objects of the policy (by its label) come from the controller's
watches (controller.indexes), or are listed once where it does not watch them;
an object whose live state already contains everything we want is left alone
(no request at all), others are server-side applied with one field manager,
and labelled objects we no longer want are deleted. A watch a moment behind the
controller's own writes costs at most a write again (the same manifest: the API
server changes nothing) or a delete that finds nothing.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog

from gpuslice.dra.names import LABEL_POLICY, short_hash
from gpuslice.dra.support import dropped_message, dropped_paths
from gpuslice.kube.client import Invalid, KubeClient, KubeError, NotFound
from gpuslice.kube.paths import collection, object_path
from gpuslice.observability.failpoints import failpoint

FIELD_MANAGER = "gpuslice-controller"
APPLIED = "gpuslice.dev/applied"  # annotation: hash of the manifest last applied
log = structlog.get_logger(__name__)

# Kinds a policy owns, in the order they are applied: the classes and each tenant's quota first
# (a tenant is admitted once its quota is in place), then the templates (and taint rules).
LIMIT_KINDS = (("resource.k8s.io/v1", "DeviceClass"), ("v1", "ResourceQuota"))
REST_KINDS = (("resource.k8s.io/v1", "ResourceClaimTemplate"),)
# maxMemory ledgers (their spec), in gpuslice's namespace: after the quotas, before anyone is admitted.
LEDGER_KINDS = (("gpuslice.dev/v1alpha1", "GpuSliceLedger"),)
OWNED_KINDS = (*LIMIT_KINDS, *REST_KINDS)
# What the controller watches of them (controller.indexes.OWNED); DeviceTaintRules, which it only
# prunes (an earlier version made them), are listed.
WATCHED_KINDS = frozenset({*OWNED_KINDS, *LEDGER_KINDS})


def contains(want: Any, have: Any) -> bool:
    """Whether ``have`` already holds all of ``want`` (the server may add defaults)."""
    if isinstance(want, dict):
        return isinstance(have, dict) and all(k in have and contains(v, have[k]) for k, v in want.items())
    if isinstance(want, list):
        return (isinstance(have, list) and len(want) == len(have)
                and all(contains(a, b) for a, b in zip(want, have, strict=True)))
    return bool(want == have)


@dataclass
class ApplyResult:
    written: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    failed: set[str] = field(default_factory=set)  # paths of the objects that could not be applied
    taken: list[str] = field(default_factory=list)  # objects of our name that someone else made


async def _taken(kube: KubeClient, policy: str, path: str) -> bool:
    """Whether an object we failed to create exists and is not ours (a tenant made it first)."""
    try:
        found = await kube.get(path)
    except KubeError:
        return False
    return ((found.get("metadata") or {}).get("labels") or {}).get(LABEL_POLICY) != policy


def stamped(manifest: dict[str, Any]) -> dict[str, Any]:
    """``manifest`` with a hash of itself: ``contains`` alone cannot see a field we stopped
    wanting (the live object still has it), but the hash differs, and applying then removes it."""
    digest = short_hash(json.dumps(manifest, sort_keys=True), length=16)
    meta = manifest["metadata"]
    return {**manifest, "metadata": {**meta, "annotations": {**(meta.get("annotations") or {}), APPLIED: digest}}}


Applied = MutableMapping[str, tuple[str | None, int]]  # path -> (digest applied, None: deleted; resourceVersion)


def _version(body: Mapping[str, Any] | None) -> int | None:
    text = str(((body or {}).get("metadata") or {}).get("resourceVersion"))
    return int(text) if text.isdigit() else None


def newer(applied: Applied | None, path: str, live: Mapping[str, Any] | None) -> tuple[str | None, int] | None:
    """What the controller itself last did to ``path``, when the watch shows it (``live``) at an older
    version. An object the watch does not show is not judged so: it may have been deleted since."""
    mine = (applied or {}).get(path)
    version = _version(live)
    if mine is None or version is None or version >= mine[1]:
        return None
    return mine


async def apply_object(kube: KubeClient, manifest: dict[str, Any], live: dict[str, Any] | None,
                       applied: Applied | None = None) -> dict[str, Any] | None:
    """Apply ``manifest`` unless ``live`` already matches, or (``applied``) the controller's own
    write of it that the watch has not shown yet does; the server's answer when something was
    written, None when nothing was."""
    manifest = stamped(manifest)
    path = object_path(manifest)
    mine = newer(applied, path, live)
    if mine is not None and mine[0] == manifest["metadata"]["annotations"][APPLIED]:
        return None
    if mine is None and live is not None and contains(manifest, live):
        return None
    try:
        answer = await kube.apply(path, manifest, field_manager=FIELD_MANAGER)
    except Invalid as error:
        if not (error.immutable and live is not None):
            raise
        # A ResourceClaimTemplate's spec cannot change: replace the template. Claims
        # already made from it keep their own copy of the spec.
        await kube.delete(path)
        answer = await kube.apply(path, manifest, field_manager=FIELD_MANAGER)
    version = _version(answer)
    if applied is not None and version is not None:
        applied[path] = (manifest["metadata"]["annotations"][APPLIED], version)
    return answer


async def converge(
    kube: KubeClient, policy: str, desired: Sequence[dict[str, Any]], kinds: Sequence[tuple[str, str]],
    watched: Sequence[Mapping[str, Any]] | None = None, applied: Applied | None = None,
) -> ApplyResult:
    """Apply ``desired`` and delete the policy's other objects of ``kinds``. ``watched``: the
    policy's objects as the controller's watches hold them, for the kinds in WATCHED_KINDS (None:
    listed); the others are listed. ``applied``: what the controller itself last wrote or deleted,
    taken over a watched object older than that (kept up to date here)."""
    result = ApplyResult()
    wanted = {object_path(m): m for m in desired}
    for api_version, kind in kinds:
        try:
            if watched is not None and (api_version, kind) in WATCHED_KINDS:
                items = [dict(o) for o in watched if (o.get("apiVersion"), o.get("kind")) == (api_version, kind)]
            else:
                items = await kube.list(collection(api_version, kind), labelSelector=f"{LABEL_POLICY}={policy}")
        except KubeError as error:
            result.errors.append(f"listing {kind}: {error.message}")
            result.failed |= {p for p, m in wanted.items() if (m["apiVersion"], m["kind"]) == (api_version, kind)}
            continue
        live = {}
        for item in items:
            item.setdefault("apiVersion", api_version)
            item.setdefault("kind", kind)
            live[object_path(item)] = item
        for path, manifest in wanted.items():
            if (manifest["apiVersion"], manifest["kind"]) != (api_version, kind):
                continue
            meta = manifest["metadata"]
            where = f"{meta['namespace']}/{meta['name']}" if meta.get("namespace") else meta["name"]
            try:
                answer = await apply_object(kube, manifest, live.get(path), applied)
                if answer is not None:
                    result.written.append(path)
                    failpoint("controller.object-applied")
                    # Accepted is not kept: a gate that is off drops its fields (the class without its
                    # extended resource, the template without its capacity request) without an error.
                    if lost := dropped_paths(manifest.get("spec"), answer.get("spec"), "spec"):
                        result.errors.append(dropped_message(kind, where, lost))
            except KubeError as error:
                result.failed.add(path)
                if path not in live and await _taken(kube, policy, path):
                    result.taken.append(f"{kind} {where}")
                else:
                    result.errors.append(f"applying {kind} {where}: {error.message}")
        for path in sorted(set(live) - set(wanted)):
            mine = newer(applied, path, live[path])
            if mine is not None and mine[0] is None:
                continue  # deleted already; the watch has not shown it yet
            try:
                answer = await kube.delete(path)
                result.deleted.append(path)
                version = _version(answer)
                if applied is not None and version is not None:
                    applied[path] = (None, version + 1)  # its deletion comes after its last version
            except NotFound:
                pass
            except KubeError as error:
                result.errors.append(f"deleting {path}: {error.message}")
    if result.written or result.deleted or result.errors or result.taken:
        log.info("converged", policy=policy, written=result.written, deleted=result.deleted, errors=result.errors,
                 taken=result.taken)
    return result
