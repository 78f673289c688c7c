"""Kubernetes quantities as exact numbers."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuslice.dra.quantity import format_bytes, parse_quantity, quantity_bytes


@pytest.mark.parametrize(("text", "value"), [("10Gi", 10 * 2**30), ("512Mi", 2**29), ("1.5Gi", 3 * 2**29),
                                             ("40G", 40 * 10**9), ("1e3", 1000), ("100m", 1), ("0", 0)])
def test_parses(text: str, value: int) -> None:
    assert quantity_bytes(text) == value


@pytest.mark.parametrize("text", ["ten", "10GB", "", "1.2.3Gi", "--1"])
def test_rejects_with_an_example(text: str) -> None:
    with pytest.raises(ValueError, match="examples: 10Gi"):
        parse_quantity(text)


@given(st.integers(min_value=1, max_value=2**50))
def test_format_round_trips(value: int) -> None:
    assert quantity_bytes(format_bytes(value)) == value
