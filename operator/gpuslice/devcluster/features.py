"""Which feature gates and API versions each Kubernetes minor needs for what we use.

gpuslice uses partitionable devices, consumable capacity, device taints and
DeviceTaintRules, admin access, prioritized lists and extended resources. On
1.37 all of them are on by default and served in ``resource.k8s.io/v1``; we
still name the beta and unlocked-GA gates so the intent is written down and a
minor that flips a default fails here rather than in a test. Locked GA gates
are left alone: setting them is at best a warning.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpuslice.devcluster.errors import DevClusterError


@dataclass(frozen=True)
class Features:
    gates: dict[str, bool]
    runtime_config: tuple[str, ...]
    taint_rule_version: str  # resource.k8s.io version that serves DeviceTaintRule

    def flags(self, *, apiserver: bool = False) -> list[str]:
        flags = []
        if self.gates:
            gates = ",".join(f"{name}={str(on).lower()}" for name, on in sorted(self.gates.items()))
            flags.append(f"--feature-gates={gates}")
        if apiserver and self.runtime_config:
            flags.append(f"--runtime-config={','.join(self.runtime_config)}")
        return flags


_BY_MINOR = {
    36: Features(
        gates={
            "DRAPartitionableDevices": True,
            "DRAConsumableCapacity": True,
            "DRADeviceTaints": True,
            "DRADeviceTaintRules": True,
            "DRAExtendedResource": True,
        },
        runtime_config=("resource.k8s.io/v1beta2=true",),
        taint_rule_version="v1beta2",
    ),
    37: Features(
        gates={
            "DRAPartitionableDevices": True,
            "DRAConsumableCapacity": True,
            "DRADeviceTaints": True,
            "DRADeviceTaintRules": True,
        },
        runtime_config=(),
        taint_rule_version="v1",
    ),
}
OLDEST, NEWEST = min(_BY_MINOR), max(_BY_MINOR)


def parse_version(text: str) -> tuple[int, int, int]:
    """``"Kubernetes v1.37.2"`` -> ``(1, 37, 2)``."""
    match = re.search(r"v(\d+)\.(\d+)\.(\d+)", text)
    if match is None:
        raise DevClusterError(
            f"Could not read a Kubernetes version from `kube-apiserver --version`: {text!r}."
            " The binary may be built without version ldflags; rebuild with `make kube-bin`."
        )
    major, minor, patch = (int(part) for part in match.groups())
    return major, minor, patch


def features_for(version: tuple[int, int, int]) -> Features:
    major, minor, _ = version
    if major != 1 or minor < OLDEST:
        raise DevClusterError(
            f"Kubernetes {'.'.join(map(str, version))} is too old for gpuslice: it needs 1.{OLDEST}"
            f" or newer (partitionable devices and consumable capacity in resource.k8s.io)."
            " Use `make kube-bin` to build 1.37, or point KUBEBUILDER_ASSETS at newer binaries."
        )
    return _BY_MINOR[min(minor, NEWEST)]
