"""Which feature gates and API versions the dev cluster sets for each Kubernetes minor: none.

gpuslice claims to run on a stock cluster of each supported minor (``dra.support.MATRIX``), so
the dev cluster runs each one as its release ships it: no ``--feature-gates``, no
``--runtime-config``. What a minor serves by default is recorded here (where DeviceTaintRule is
served, if anywhere) and checked against the running server by the cluster tests
(``tests/cluster/devcluster/test_discovery.py``), so a minor that changes a default fails there.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpuslice.devcluster.errors import DevClusterError


@dataclass(frozen=True)
class Features:
    gates: dict[str, bool]
    runtime_config: tuple[str, ...]
    taint_rule_version: str | None  # resource.k8s.io version that serves DeviceTaintRule; None: none

    def flags(self, *, apiserver: bool = False) -> list[str]:
        flags = []
        if self.gates:
            gates = ",".join(f"{name}={str(on).lower()}" for name, on in sorted(self.gates.items()))
            flags.append(f"--feature-gates={gates}")
        if apiserver and self.runtime_config:
            flags.append(f"--runtime-config={','.join(self.runtime_config)}")
        return flags


_BY_MINOR = {
    # DeviceTaintRule is beta in 1.36, behind a gate that is off and resource.k8s.io/v1beta2, which is
    # not served by default (pkg/features/kube_features.go, pkg/controlplane/instance.go at v1.36.3).
    36: Features(gates={}, runtime_config=(), taint_rule_version=None),
    37: Features(gates={}, runtime_config=(), taint_rule_version="v1"),
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
