"""Leader election's bounds that a real API server cannot be made to break on cue: a Lease request
that hangs (the fault is injected) is given up at the renew deadline, as client-go does."""

from __future__ import annotations

import asyncio
import time
from typing import Any, cast

import pytest

from gpuslice.controller.leader import LeaderElector
from gpuslice.kube.client import KubeClient, KubeError


class Hangs:
    async def get(self, path: str, **query: Any) -> dict[str, Any]:
        await asyncio.sleep(3600)
        return {}


async def test_a_lease_request_that_hangs_is_given_up_at_the_renew_deadline() -> None:
    elector = LeaderElector(kube=cast(KubeClient, Hangs()), holder="me", renew_deadline=0.05)
    started = time.monotonic()
    with pytest.raises(KubeError, match=r"no answer about the Lease within 0\.05 s"):
        await elector.attempt()
    assert time.monotonic() - started < 1
    assert not elector.leading()
