"""Feature gates and API versions chosen per Kubernetes minor."""

from __future__ import annotations

import pytest

from gpuslice.devcluster.errors import DevClusterError
from gpuslice.devcluster.features import features_for, parse_version


def test_parses_apiserver_version_output() -> None:
    assert parse_version("Kubernetes v1.37.2\n") == (1, 37, 2)


def test_unversioned_binary_is_explained() -> None:
    with pytest.raises(DevClusterError, match="version ldflags"):
        parse_version("Kubernetes (devel)")


def test_binary_without_version_ldflags_is_too_old() -> None:
    with pytest.raises(DevClusterError, match="too old"):
        features_for(parse_version("Kubernetes v0.0.0-master+$Format:%H$"))


def test_137_needs_no_runtime_config_and_serves_taint_rules_in_v1() -> None:
    features = features_for((1, 37, 2))
    assert features.taint_rule_version == "v1"
    assert not any(f.startswith("--runtime-config") for f in features.flags(apiserver=True))
    gates = next(f for f in features.flags() if f.startswith("--feature-gates="))
    assert "DRAPartitionableDevices=true" in gates
    assert "DRAConsumableCapacity=true" in gates
    # Locked GA gates are not set: setting them is at best a warning.
    assert "DRAAdminAccess" not in gates
    assert "DRAPrioritizedList" not in gates


def test_136_enables_taint_rules_through_v1beta2() -> None:
    features = features_for((1, 36, 3))
    assert "--runtime-config=resource.k8s.io/v1beta2=true" in features.flags(apiserver=True)
    assert not any(f.startswith("--runtime-config") for f in features.flags())
    assert features.taint_rule_version == "v1beta2"


def test_newer_minor_uses_newest_known_set() -> None:
    assert features_for((1, 39, 0)) == features_for((1, 37, 0))


def test_too_old_kubernetes_is_refused_with_the_fix() -> None:
    with pytest.raises(DevClusterError, match=r"1\.35\.4 is too old.*make kube-bin"):
        features_for((1, 35, 4))
