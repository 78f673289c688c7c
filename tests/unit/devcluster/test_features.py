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


@pytest.mark.parametrize("version", [(1, 36, 3), (1, 37, 2)])
def test_every_minor_runs_stock_with_no_gate_and_no_runtime_config(version: tuple[int, int, int]) -> None:
    features = features_for(version)
    assert features.flags(apiserver=True) == []
    assert features.flags() == []


def test_devicetaintrules_are_served_in_v1_on_137_and_nowhere_on_a_stock_136() -> None:
    assert features_for((1, 37, 2)).taint_rule_version == "v1"
    assert features_for((1, 36, 3)).taint_rule_version is None


def test_newer_minor_uses_newest_known_set() -> None:
    assert features_for((1, 39, 0)) == features_for((1, 37, 0))


def test_too_old_kubernetes_is_refused_with_the_fix() -> None:
    with pytest.raises(DevClusterError, match=r"1\.35\.4 is too old.*make kube-bin"):
        features_for((1, 35, 4))
