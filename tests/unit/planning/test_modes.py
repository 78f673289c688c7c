"""The registry of slicing modes: the API's names, the pure modes, their traits and the kubelet
plugin's preparation name the same modes, so adding one and forgetting a side fails here."""

from __future__ import annotations

from typing import get_args

from gpuslice.agent.kubeletplugin.modes import PREPS
from gpuslice.api.policy import SlicingModeName
from gpuslice.dra.support import FEATURES
from gpuslice.planning.mode_traits import TRAITS
from gpuslice.planning.modes import MODES


def test_every_side_names_the_same_modes() -> None:
    names = set(get_args(SlicingModeName))
    assert set(MODES) == names
    assert set(TRAITS) == names
    assert set(PREPS) == names


def test_each_mode_carries_its_own_traits() -> None:
    for name, mode in MODES.items():
        assert mode.name == name
        assert mode.traits is TRAITS[name]


def test_traits_read_kinds_as_the_modes_make_them() -> None:
    assert TRAITS["memory"].kind("10Gi", "") == "slice"
    assert TRAITS["memory"].kind("full", "") == "full"
    assert TRAITS["shared"].kind("10Gi", "") == "shared"
    assert TRAITS["mig"].kind("", "1g.10gb") == "1g.10gb"


def test_the_support_matrix_names_only_registered_modes() -> None:
    """dra.support sits below planning and names the modes each feature gate serves; a new mode
    must appear there (device taints serve every mode: drains and held changes rest on them)."""
    named = {mode for feature in FEATURES.values() for mode in feature.modes}
    assert named == set(MODES)
    assert set(FEATURES["taints"].modes) == set(MODES)
