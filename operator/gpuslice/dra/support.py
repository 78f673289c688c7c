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

from gpuslice.dra.slice_wire import slice_counter_sets, slice_devices

NEEDED_RESOURCES = ("deviceclasses", "resourceclaims", "resourceclaimtemplates", "resourceslices")
API = "resource.k8s.io/v1"


@dataclass(frozen=True)
class Release:
    """One Kubernetes minor of the support matrix: the one place that says which versions gpuslice
    runs on. README's table, the chart's ``kubeVersion`` and every docs line that names a range are
    generated from it or checked against it (``tests/unit/dra/test_support_docs.py``)."""

    minor: int
    first_patch: int | None  # the oldest patch gpuslice runs on; None: the minor is refused
    needs: str  # what the cluster needs beyond its defaults (a refused minor: what it lacks, briefly)
    caveats: str  # what is missing or slower on it
    tier: str  # what tests it (a row no tier runs on says so)
    tested: str = ""  # the patch the tier runs (hack/kube's go.mod or go.1.MINOR.mod)
    # The message the controller and agents stop with: on a refused minor, or a patch before first_patch.
    refusal: str = ""

    @property
    def supported(self) -> bool:
        return self.first_patch is not None


# Facts read in k8s.io/kubernetes v1.35.4, v1.36.3 and v1.37.2 (pkg/features/kube_features.go,
# pkg/controlplane/instance.go, CHANGELOG/CHANGELOG-1.36.md) and the scheduler's allocator,
# k8s.io/dynamic-resource-allocation v0.35.10, v0.36.0 to v0.36.6 and v0.37.0 (structured/internal).
MATRIX: tuple[Release, ...] = (
    Release(
        35, None, needs="partitionable devices, consumable capacity and device taints are alpha and off", caveats="",
        tier="unit tier (the refusal)",
        refusal="partitionable devices, consumable capacity and device taints are alpha there and off unless the"
                " gates DRAPartitionableDevices, DRAConsumableCapacity and DRADeviceTaints are turned on on every"
                " apiserver, scheduler, controller-manager and kubelet (which managed clusters do not let users"
                " do), and no 1.35 scheduler up to 1.35.10 has the fix for double allocation"
                " (kubernetes/kubernetes#139034)"),
    Release(
        36, 2, needs="nothing (DeviceTaintRule is not served; gpuslice needs none)",
        caveats="memory slices and MIG schedule slower than on 1.37", tier="`make test-136`, in `.ci/run`",
        tested="v1.36.3",
        refusal="its kube-scheduler panics on a claim with allocationMode: All that selects a device consuming"
                " shared counters (kubernetes/kubernetes#138885, fixed in 1.36.2): any tenant of a memory or MIG"
                " policy could stop all scheduling; 1.36.2 also fixes the double allocation of overlapping"
                " partitions (kubernetes/kubernetes#139034)"),
    Release(37, 0, needs="nothing", caveats="", tier="`make test` and the kind tier", tested="v1.37.2"),
)
RELEASES = {r.minor: r for r in MATRIX}
OLDEST = next((r.minor, r.first_patch) for r in MATRIX if r.first_patch is not None)
NEWEST_TESTED_MINOR = max(r.minor for r in MATRIX if r.supported)


def oldest_version() -> str:
    """``1.36.2``: the oldest Kubernetes gpuslice runs on."""
    return f"1.{OLDEST[0]}.{OLDEST[1]}"


def supported_range() -> str:
    """How docs name the range: ``Kubernetes 1.36.2 or newer (tested: 1.36 and 1.37)``."""
    tested = [f"1.{r.minor}" for r in MATRIX if r.supported]
    return f"Kubernetes {oldest_version()} or newer (tested: {' and '.join(tested)})"


def chart_kube_version() -> str:
    """The chart's ``kubeVersion`` (``-0`` admits the pre-release suffixes managed clusters add)."""
    return f">={oldest_version()}-0"


def matrix_table() -> str:
    """README's and docs/install.md's support table, in Markdown."""
    rows = ["| Kubernetes | gpuslice | the cluster needs | tested by |", "|---|---|---|---|"]
    for release in sorted(MATRIX, key=lambda r: -r.minor):
        if release.first_patch is None:
            older = " and older" if release.minor == min(RELEASES) else ""
            rows.append(f"| 1.{release.minor}{older} | refused: {release.needs} | | {release.tier} |")
            continue
        since = "every patch" if release.first_patch == 0 else f"1.{release.minor}.{release.first_patch} or newer"
        caveats = f"; {release.caveats}" if release.caveats else ""
        rows.append(f"| 1.{release.minor} | {since}{caveats} | {release.needs} | {release.tier}"
                    f"{f' ({release.tested}, stock)' if release.tested else ''} |")
    return "\n".join(rows)


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


def version_of(version: Mapping[str, Any]) -> tuple[int, int, int | None] | None:
    """(major, minor, patch) from the apiserver's /version; ``minor`` may read ``37+`` on managed
    clusters and ``gitVersion`` carry a vendor's suffix (``v1.36.3-eks-1a2b``). Patch None: unread."""
    match = re.search(r"v(\d+)\.(\d+)\.(\d+)", str(version.get("gitVersion", "")))
    if match:
        return int(match.group(1)), int(match.group(2)), int(match.group(3))
    try:
        major = int(str(version.get("major", "")).rstrip("+"))
        return major, int(re.sub(r"\D.*$", "", str(version.get("minor", "")))), None
    except ValueError:
        return None


def version_problems(found: tuple[int, int, int | None], text: str) -> tuple[list[str], list[str]]:
    """(problems, warnings) of the server's version against MATRIX."""
    major, minor, patch = found
    release = RELEASES.get(minor) if major == 1 else None
    if major != 1 or minor < min(RELEASES) or (release is not None and not release.supported):
        what = f": {release.refusal}" if release is not None else ""
        return [f"Kubernetes {text} is too old for gpuslice{what}. gpuslice needs {oldest_version()} or newer"
                " (partitionable devices, consumable capacity and device taints on by default): upgrade the"
                " cluster (the support matrix is in docs/install.md)"], []
    if minor > NEWEST_TESTED_MINOR:
        return [], [f"Kubernetes {text} is newer than gpuslice has been tested on (up to 1.{NEWEST_TESTED_MINOR});"
                    " proceeding"]
    assert release is not None
    assert release.first_patch is not None
    if patch is None:
        return [], [f"the patch of Kubernetes {text} could not be read; gpuslice needs {oldest_version()} or newer"]
    if patch < release.first_patch:
        return [f"Kubernetes {text} is refused: {release.refusal}. Upgrade to 1.{minor}.{release.first_patch} or"
                " newer (the scheduler too: the check reads the API server's version)"], []
    return [], []


def judge_server(version: Mapping[str, Any], served: Mapping[str, Sequence[str]]) -> Verdict:
    """``served``: resource.k8s.io version -> resources, as discovery lists them."""
    text = str(version.get("gitVersion") or f"{version.get('major')}.{version.get('minor')}")
    found = version_of(version)
    problems: list[str] = []
    warnings: list[str] = []
    if found is None:
        warnings.append(f"the server's version {text!r} could not be read; assuming it serves what gpuslice needs")
    else:
        problems, warnings = version_problems(found, text)
    missing = [r for r in NEEDED_RESOURCES if r not in served.get("v1", ())]
    if missing:
        problems.append(f"the server does not serve {', '.join(missing)} in {API} (served: "
                        + (", ".join(f"{v}: {len(r)} resources" for v, r in sorted(served.items())) or "nothing")
                        + "); gpuslice needs DRA's v1 API (GA since 1.34)")
    return Verdict(text, tuple(problems), tuple(warnings))


def taint_rule_api(served: Mapping[str, Sequence[str]]) -> str | None:
    """Where the server serves DeviceTaintRule (``resource.k8s.io/v1`` from 1.37; ``v1beta2`` on a 1.36
    that turned it on), or None: a stock 1.36 does not serve it at all, and gpuslice, which makes
    none, must not ask for it there (every converge would fail on the 404)."""
    return next((f"resource.k8s.io/{v}" for v in ("v1", "v1beta2") if "devicetaintrules" in served.get(v, ())),
                None)


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
    devices = {d.get("name"): d for d in slice_devices(device_slice.get("spec") or {})}
    partition, shared = devices.get("probe-partition") or {}, devices.get("probe-shared") or {}
    counters = slice_counter_sets((counter_slice or {}).get("spec") or {})
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
    if slice_counter_sets(sent) and not slice_counter_sets(returned):
        lost.append((None, "sharedCounters"))
    back = slice_devices(returned)
    for index, device in enumerate(slice_devices(sent)):
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


# A field of an object the controller writes -> the feature gate that, when off, makes the API server
# drop it without an error (pkg/registry/resource/*/strategy.go, dropDisabledFields).
OBJECT_GATES = {"extendedResourceName": "DRAExtendedResource", "capacity": "DRAConsumableCapacity",
                "firstAvailable": "DRAPrioritizedList", "adminAccess": "DRAAdminAccess"}


def dropped_paths(sent: Any, returned: Any, path: str = "") -> list[str]:
    """The paths of what ``sent`` holds and ``returned`` lacks (the server may add defaults, not
    take away): a field dropped by a gate that is off, rather than refused."""
    if isinstance(sent, dict):
        if not isinstance(returned, dict):
            return [path or "."]
        lost: list[str] = []
        for key, value in sent.items():
            where = f"{path}.{key}" if path else key
            lost += dropped_paths(value, returned[key], where) if key in returned else [where]
        return lost
    if isinstance(sent, list):
        if not isinstance(returned, list) or len(returned) < len(sent):
            return [path]
        return [p for i, item in enumerate(sent) for p in dropped_paths(item, returned[i], f"{path}[{i}]")]
    return []


def dropped_message(kind: str, name: str, paths: Sequence[str]) -> str:
    """What to say of a written object that came back without some of its fields, and the fix."""
    gates = sorted({OBJECT_GATES[part] for p in paths for part in re.split(r"[.\[]", p) if part in OBJECT_GATES})
    why = (f"the feature gate {' and '.join(gates)} is off: turn it on on every apiserver, scheduler,"
           " controller-manager and kubelet" if gates else
           "a feature gate that is off, or a mutating admission webhook, takes it away")
    return (f"the API server stored {kind} {name} without {', '.join(paths[:3])}{' ...' if len(paths) > 3 else ''}"
            f" (accepted without an error): {why}")


if __name__ == "__main__":  # README's and docs/install.md's table, between their support-matrix markers
    print(matrix_table())
