"""Fixtures for unit tests that need an API server: the fake one (tests.fakeapi), and gpuslice's own
client talking to it over loopback HTTP. One server and one client serve the whole session (a
client's TLS context alone costs 20 ms to make); each test gets the server reset, empty."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from gpuslice.kube.client import KubeClient
from tests.fakeapi import FakeApi


@pytest.fixture(scope="session")
async def served() -> AsyncIterator[tuple[FakeApi, KubeClient]]:
    api = FakeApi()
    async with api.serving(), api.client() as client:
        yield api, client


@pytest.fixture
def api(served: tuple[FakeApi, KubeClient]) -> FakeApi:
    served[0].reset()
    return served[0]


@pytest.fixture
def kube(served: tuple[FakeApi, KubeClient], api: FakeApi) -> KubeClient:
    return served[1]
