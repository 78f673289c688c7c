"""Ask the API server about a whole generation of the pool before writing any of it.

A pool is several slices written one by one. If the server refuses one of them (its own
validation, or an admission rule of the cluster that gpuslice cannot foresee), the slices
written before it carry the new generation and the rest the old: the scheduler sees an
incomplete pool and ignores all of it, every policy's devices on the node, and each retry
bumps the generation again. So every slice is first applied with ``dryRun=All`` (validation
and every admission rule run, nothing is stored), and only a generation that passes whole
is written. When one does not, :func:`refused_policies` finds the policies whose devices the
server refuses, so the publisher can leave them out and keep every other policy's devices.

A slice the server accepted is not asked about again for a short while (:class:`Accepted`): a
cycle whose write failed for want of an answer (a loaded server's 429, a dropped connection)
writes the same generation again, and a thousand agents converging at once asked twice as often
as they wrote (the scale figure, bench/README.md). A write that fails, or is stored without a
field it sent, forgets every yes (:meth:`Accepted.forget`).
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuslice.backoff import spread
from gpuslice.coordinates import object_path
from gpuslice.dra.slice_wire import slice_devices
from gpuslice.dra.support import lost_fields, lost_gates
from gpuslice.dra.wire import device_policy
from gpuslice.kube.client import BadRequest, Forbidden, Invalid, KubeClient, KubeError

# A policy the server refused is tried again after a while even if it did not change, since the
# cluster's rules may have (an admission policy removed, an apiserver upgraded): after 10 s, then
# twice as long each time it is refused again, up to 5 minutes, each wait jittered (give or take half:
# a fleet refused together tries again apart). A change of the policy tries at once.
FIRST_RETRY, LAST_RETRY = 10.0, 300.0
_DEVICE_FIELD = re.compile(r"^spec\.devices\[(\d+)\]")
# How long a dry run's yes stands for a slice of the same content. Short: the cluster's rules may
# change (an admission policy added), and a yes older than a cycle's retry is asked again.
ACCEPTED_FOR = 30.0


def is_refusal(error: KubeError) -> bool:
    """The server judged the object and said no (not: it could not answer, or was not ready to)."""
    return isinstance(error, Invalid | Forbidden | BadRequest) and not error.transient


class GenerationRefused(KubeError):
    """The server refuses the pool's next generation and no policy can be blamed for it
    (e.g. a counter slice, or a rule about the slice as a whole): nothing is written."""

    def __init__(self, message: str) -> None:
        super().__init__(422, "GenerationRefused", message, None)


@dataclass(frozen=True)
class Refusal:
    generation: int | None
    reason: str
    since: float
    wait: float  # the nominal wait (doubling), in seconds
    until: float = 0.0  # when the policy is tried again: ``since`` + ``wait``, jittered


@dataclass
class Refusals:
    """Policies whose devices the server refused on this node, at which generation and why
    (this process only: a restarted agent tries them again, which costs one dry run)."""

    by_policy: dict[str, Refusal] = field(default_factory=dict)

    def current(self, generations: Mapping[str, int | None], now: float | None = None) -> dict[str, str]:
        """Refusals still in force: the policy has not changed since, and its wait is not over."""
        now = time.monotonic() if now is None else now
        self.by_policy = {name: entry for name, entry in self.by_policy.items()
                          if name in generations and entry.generation == generations[name]}
        return {name: entry.reason for name, entry in self.by_policy.items() if now < entry.until}

    def record(self, refused: Mapping[str, str], generations: Mapping[str, int | None],
               now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        for name, reason in refused.items():
            before = self.by_policy.get(name)
            again = before is not None and before.generation == generations.get(name)
            wait = min(2 * before.wait, LAST_RETRY) if before is not None and again else FIRST_RETRY
            self.by_policy[name] = Refusal(generations.get(name), reason, now, wait, now + spread(wait))


def _content(manifest: Mapping[str, Any]) -> str:
    """The slice as sent, but for the pool's generation (each try of a change bumps it)."""
    spec = dict(manifest.get("spec") or {})
    spec["pool"] = {k: v for k, v in (spec.get("pool") or {}).items() if k != "generation"}
    text = json.dumps({**manifest, "spec": spec}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass
class Accepted:
    """Slices the server accepted in a dry run, by name: their content (less the generation) and
    when. This process only; a restarted agent asks again."""

    by_name: dict[str, tuple[str, float]] = field(default_factory=dict)

    def fresh(self, manifest: Mapping[str, Any], now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        found = self.by_name.get(str(manifest["metadata"]["name"]))
        return found is not None and found[0] == _content(manifest) and now - found[1] < ACCEPTED_FOR

    def remember(self, manifest: Mapping[str, Any], now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        self.by_name = {n: v for n, v in self.by_name.items() if now - v[1] < ACCEPTED_FOR}
        self.by_name[str(manifest["metadata"]["name"])] = (_content(manifest), now)

    def forget(self) -> None:
        """Every yes: a write the dry run said yes to failed (a rule came between them, or another API
        server judged it), so the next cycle asks again and the policy refused is left out, rather
        than writing the same half generation again on the strength of the old answer."""
        self.by_name.clear()


async def dry_run(kube: KubeClient, manifests: Iterable[dict[str, Any]], field_manager: str,
                  accepted: Accepted | None = None) -> dict[str, KubeError]:
    """The slices the server refuses, with its answer; empty when it would store them all. With
    ``accepted``, a slice it accepted within ``ACCEPTED_FOR`` is not asked about again."""
    refused: dict[str, KubeError] = {}
    for manifest in manifests:
        name = manifest["metadata"]["name"]
        if accepted is not None and accepted.fresh(manifest):
            continue
        try:
            answer = await kube.apply(object_path(manifest), manifest, field_manager=field_manager, dry_run=True)
        except KubeError as error:
            if not is_refusal(error):
                raise
            refused[name] = error
            continue
        lost = lost_fields(manifest["spec"], (answer or {}).get("spec") or {}) if isinstance(answer, dict) else []
        if lost:  # accepted, but not as sent: as good as refused, and the devices say whose
            fields = sorted({f"spec.devices[{i}].{field}" if i is not None else f"spec.{field}" for i, field in lost})
            refused[name] = Invalid(422, "FieldsDropped", (
                f"the API server drops {', '.join(fields[:3])}{' ...' if len(fields) > 3 else ''} of slice {name}"
                f" without an error: turn on the feature gate {' and '.join(lost_gates(lost))} on every apiserver"
                " and the scheduler"), {"details": {"causes": [{"field": f} for f in fields]}})
        elif accepted is not None:
            accepted.remember(manifest)
    return refused


def _named_devices(error: KubeError) -> set[int]:
    causes = (error.body.get("details") or {}).get("causes") or []
    return {int(m.group(1)) for c in causes if (m := _DEVICE_FIELD.match(str(c.get("field") or "")))}


async def refused_policies(kube: KubeClient, manifests: Iterable[dict[str, Any]], refused: Mapping[str, KubeError],
                           field_manager: str) -> dict[str, str]:
    """Which policies' devices the server refuses, and its message; raises GenerationRefused
    when a refusal cannot be pinned on some (not all) of the policies in a slice."""
    blamed: dict[str, str] = {}
    for manifest in manifests:
        name = manifest["metadata"]["name"]
        if name not in refused:
            continue
        error = refused[name]
        devices = slice_devices(manifest["spec"])
        by_policy: dict[str, list[dict[str, Any]]] = {}
        for device in devices:
            by_policy.setdefault(device_policy(device) or "", []).append(device)
        named = {device_policy(devices[i]) for i in _named_devices(error) if i < len(devices)}
        if named and None not in named:
            culprits = {str(p): error.message for p in named}
        elif len(by_policy) == 1 and "" not in by_policy:
            culprits = {next(iter(by_policy)): error.message}
        else:  # an admission rule names no field: ask about each policy's devices alone
            culprits = {}
            for policy, own in sorted(by_policy.items()):
                alone = {**manifest, "spec": {**manifest["spec"], "devices": own}}
                try:
                    await kube.apply(object_path(alone), alone, field_manager=field_manager, dry_run=True)
                except KubeError as alone_error:
                    if not is_refusal(alone_error):
                        raise
                    culprits[policy] = alone_error.message
        if not culprits or "" in culprits or (len(culprits) == len(by_policy) > 1):
            raise GenerationRefused(
                f"the API server refuses slice {name} of the pool's next generation, and not for one policy's"
                f" devices: {error.message}. The pool stays as published.")
        blamed.update(culprits)
    return blamed
