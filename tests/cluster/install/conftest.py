"""The install checks' tools: kustomize (the version kubectl v1.37 embeds), built and cached by
hack/kind/build.py with Go only."""

from __future__ import annotations

import pytest

from tests.hacktools import hack_tool


@pytest.fixture(scope="session")
def kustomize() -> str:
    return hack_tool("kustomize")
