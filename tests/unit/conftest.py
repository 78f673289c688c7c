"""Fixtures for unit tests that need an API server: the fake one (tests.fakeapi), and gpuslice's own
client talking to it over loopback HTTP. One server and one client serve the whole session (a
client's TLS context alone costs 20 ms to make); each test gets the server reset, empty.

The whole tier runs on a monotonic clock that reads 1 s when it starts, as on a machine booted a
second ago: code that takes 0 on that clock for "long ago" fails here, on every machine, rather
than only in CI's first hour after boot. Set before any gpuslice module is imported, so that
defaults bound at import (``clock=time.monotonic``) take it too; asyncio's loop time follows it."""

from __future__ import annotations

import time

_REAL_MONOTONIC = time.monotonic
_BOOTED_AT = _REAL_MONOTONIC() - 1.0


def _since_boot() -> float:
    return _REAL_MONOTONIC() - _BOOTED_AT


time.monotonic = _since_boot
time.monotonic_ns = lambda: int(_since_boot() * 1e9)

from collections.abc import AsyncIterator  # noqa: E402 (after the clock above)

import pytest  # noqa: E402

from gpuslice.kube.client import KubeClient  # noqa: E402
from tests.fakeapi import FakeApi  # noqa: E402


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
