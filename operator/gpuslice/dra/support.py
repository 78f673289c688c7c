"""Which Kubernetes versions gpuslice runs on, and what a cluster must serve for each slicing mode (pure).

The controller and the node agent check the server at start (``kube.compatibility``): its
version, the ``resource.k8s.io`` versions and resources it serves, and (the agent, with a
dry-run slice) whether the fields each mode writes survive. A disabled feature gate makes the
apiserver drop a field silently rather than refuse it: a partitionable device published without
its ``consumesCounters`` would let the scheduler hand out a GPU's memory twice, and a drain
without its taint would let new claims land on a device about to change. So a cluster that
drops what a mode needs is refused for that mode, with the gate to turn on.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

OLDEST_MINOR, NEWEST_TESTED_MINOR = 36, 37
NEEDED_RESOURCES = ("deviceclasses", "resourceclaims", "resourceclaimtemplates", "resourceslices")
API = "resource.k8s.io/v1"


@dataclass(frozen=True)
class Feature:
    gate: str
    what: str
    modes: tuple[str, ...]  # the slicing modes that cannot work without it (all: every mode)

    @property
    def dropped(self) -> str:
        """What a server with the gate off does, and the fix: the one wording every check uses."""
        return (f"the API server drops the fields of {self.what}: turn on the feature gate {self.gate} on every"
                " apiserver and the scheduler")


FEATURES = {
    "partitionable": Feature("DRAPartitionableDevices", "partitionable devices (KEP-4815: counter sets)",
                             ("memory", "mig")),
    "consumable": Feature("DRAConsumableCapacity", "consumable capacity (KEP-5075)", ("shared",)),
    "taints": Feature("DRADeviceTaints", "device taints (KEP-5055: drains, held changes, health)",
                      ("memory", "shared", "mig")),
}

# The support matrix, as README states it: minor -> (what is needed beyond the defaults, tested).
MATRIX: dict[int, tuple[str, bool]] = {
    36: ("defaults serve every mode (partitionable devices, consumable capacity and device taints are beta"
         " and on); DeviceTaintRules need resource.k8s.io/v1beta2 and DRADeviceTaintRules", True),
    37: ("defaults serve every mode; DeviceTaintRule is served in resource.k8s.io/v1", True),
}


@dataclass(frozen=True)
class Verdict:
    """What the server can do for gpuslice: problems refuse the start, warnings are logged."""

    version: str
    problems: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    missing: tuple[str, ...] = field(default_factory=tuple)  # keys of FEATURES the server drops

    @property
    def ok(self) -> bool:
        return not self.problems

    def unsupported_modes(self) -> dict[str, str]:
        """Slicing mode -> why this server cannot serve it (the first missing feature it needs)."""
        reasons: dict[str, str] = {}
        for key in self.missing:
            for mode in FEATURES[key].modes:
                reasons.setdefault(mode, FEATURES[key].dropped)
        return reasons


def minor_of(version: Mapping[str, Any]) -> tuple[int, int] | None:
    """(major, minor) from the apiserver's /version (``minor`` may read ``37+`` on managed clusters)."""
    try:
        major = int(str(version.get("major", "")).rstrip("+"))
        minor = int(re.sub(r"\D.*$", "", str(version.get("minor", ""))))
    except ValueError:
        match = re.search(r"v(\d+)\.(\d+)", str(version.get("gitVersion", "")))
        return (int(match.group(1)), int(match.group(2))) if match else None
    return major, minor


def judge_server(version: Mapping[str, Any], served: Mapping[str, Sequence[str]]) -> Verdict:
    """``served``: resource.k8s.io version -> resources, as discovery lists them."""
    text = str(version.get("gitVersion") or f"{version.get('major')}.{version.get('minor')}")
    found = minor_of(version)
    problems, warnings = [], []
    if found is None:
        warnings.append(f"the server's version {text!r} could not be read; assuming it serves what gpuslice needs")
    elif found[0] != 1 or found[1] < OLDEST_MINOR:
        problems.append(f"Kubernetes {text} is too old for gpuslice: it needs 1.{OLDEST_MINOR} or newer"
                        " (counter sets in their own slices, partitionable devices and consumable capacity on"
                        " by default; see the support matrix in README)")
    elif found[1] > NEWEST_TESTED_MINOR:
        warnings.append(f"Kubernetes {text} is newer than gpuslice has been tested on (up to"
                        f" 1.{NEWEST_TESTED_MINOR}); proceeding")
    missing = [r for r in NEEDED_RESOURCES if r not in served.get("v1", ())]
    if missing:
        problems.append(f"the server does not serve {', '.join(missing)} in {API} (served: "
                        + (", ".join(f"{v}: {len(r)} resources" for v, r in sorted(served.items())) or "nothing")
                        + "); gpuslice needs DRA's v1 API (GA since 1.34)")
    return Verdict(text, tuple(problems), tuple(warnings))


def probe_devices() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A counter set and devices that use every field gpuslice writes: what the agent dry-runs at start."""
    counters: list[dict[str, Any]] = [{"name": "gpuslice-probe", "counters": {"memory": {"value": "1Gi"}}}]
    devices: list[dict[str, Any]] = [
        {"name": "probe-partition", "capacity": {"memory": {"value": "1Gi"}},
         "consumesCounters": [{"counterSet": "gpuslice-probe", "counters": {"memory": {"value": "1Gi"}}}],
         "taints": [{"key": "gpuslice.dev/probe", "effect": "NoSchedule"}]},
        {"name": "probe-shared", "allowMultipleAllocations": True,
         "capacity": {"memory": {"value": "2Gi", "requestPolicy": {
             "default": "1Gi", "validRange": {"min": "1Gi", "step": "1Gi"}}}}},
    ]
    return counters, devices


def dropped(counter_slice: Mapping[str, Any] | None, device_slice: Mapping[str, Any]) -> list[str]:
    """The features (keys of FEATURES) whose fields the server dropped from the probe slices it returned."""
    gone = []
    devices = {d.get("name"): d for d in (device_slice.get("spec") or {}).get("devices") or []}
    partition, shared = devices.get("probe-partition") or {}, devices.get("probe-shared") or {}
    counters = ((counter_slice or {}).get("spec") or {}).get("sharedCounters")
    if not partition.get("consumesCounters") or (counter_slice is not None and not counters):
        gone.append("partitionable")
    if not shared.get("allowMultipleAllocations"):
        gone.append("consumable")
    if not partition.get("taints"):
        gone.append("taints")
    return gone


def judge_features(verdict: Verdict, gone: Sequence[str]) -> Verdict:
    """``verdict`` with what the probe found dropped: device taints are needed by every mode (the
    safety of drains and held changes rests on them), so without them nothing is published."""
    problems = list(verdict.problems)
    warnings = list(verdict.warnings)
    for key in gone:
        feature = FEATURES[key]
        if key == "taints":
            problems.append(f"{feature.dropped}; gpuslice cannot drain or hold a device without them")
        else:
            warnings.append(f"{feature.dropped}; policies in {' and '.join(feature.modes)} mode publish nothing here")
    return Verdict(verdict.version, tuple(problems), tuple(warnings), tuple(gone))


# A field the agent writes -> the key of FEATURES whose gate, when off, makes the server drop it.
GATED_FIELDS = {"consumesCounters": "partitionable", "taints": "taints", "allowMultipleAllocations": "consumable",
                "sharedCounters": "partitionable", "requestPolicy": "consumable"}


def lost_fields(sent: Mapping[str, Any], returned: Mapping[str, Any]) -> list[tuple[int | None, str]]:
    """(device index, field) of what the server dropped from a slice it accepted (``spec`` of each);
    index None for the slice's ``sharedCounters``. A feature gate that is off on the answering
    apiserver drops its fields without an error, and a device without its counters or taints is
    unsafe: the check runs on every dry run, not only the probe at start."""
    lost: list[tuple[int | None, str]] = []
    if sent.get("sharedCounters") and not returned.get("sharedCounters"):
        lost.append((None, "sharedCounters"))
    back = returned.get("devices") or []
    for index, device in enumerate(sent.get("devices") or []):
        answer = back[index] if index < len(back) and back[index].get("name") == device.get("name") else {}
        lost += [(index, key) for key in ("consumesCounters", "taints", "allowMultipleAllocations")
                 if device.get(key) and not answer.get(key)]
        for name, capacity in (device.get("capacity") or {}).items():
            if capacity.get("requestPolicy") and not ((answer.get("capacity") or {}).get(name) or {}).get(
                    "requestPolicy"):
                lost.append((index, f"capacity[{name}].requestPolicy"))
    return lost


def lost_gates(lost: Sequence[tuple[int | None, str]]) -> list[str]:
    """The feature gates to turn on, for what ``lost_fields`` found."""
    return sorted({FEATURES[GATED_FIELDS[field.rsplit(".", 1)[-1]]].gate for _, field in lost})
