"""Fixtures for unit tests that need an API server: the fake one (tests.fakeapi), and gpuslice's own
client talking to it over loopback HTTP."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from gpuslice.kube.client import KubeClient
from tests.fakeapi import FakeApi


@pytest.fixture
async def api() -> AsyncIterator[FakeApi]:
    async with FakeApi().serving() as served:
        yield served


@pytest.fixture
async def kube(api: FakeApi) -> AsyncIterator[KubeClient]:
    async with api.client() as client:
        yield client
