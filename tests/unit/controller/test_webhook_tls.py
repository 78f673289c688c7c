"""The webhook certificates' keeper looks again soon after a new CA, and while no webhook
configuration is there to trust it, after 10 s doubling to its interval: a cluster without the
maxMemory webhook was asked three things every 10 s for good, most of an idle controller's
requests. A stub stands for the passes; what is under test is how long the keeper waits."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from gpuslice.controller import webhook_tls
from gpuslice.controller.webhook_tls import TlsPass, keep_webhook_tls
from gpuslice.kube.client import KubeClient


async def test_no_webhook_configuration_is_looked_for_less_and_less_often(monkeypatch: pytest.MonkeyPatch) -> None:
    passes = [TlsPass("no configuration", again_soon=True)] * 6 + [TlsPass("current")] * 2
    waits: list[float] = []
    stop = asyncio.Event()

    async def ensure(kube: Any, settings: Any) -> TlsPass:
        return passes.pop(0)

    async def wait_for(awaitable: Any, timeout: float) -> None:  # noqa: ASYNC109 (asyncio.wait_for's own)
        awaitable.close()
        waits.append(timeout)
        if not passes:
            stop.set()
        raise TimeoutError

    monkeypatch.setattr(webhook_tls, "ensure_webhook_tls", ensure)
    monkeypatch.setattr(webhook_tls.asyncio, "wait_for", wait_for)
    await keep_webhook_tls(cast(KubeClient, object()), cast(Any, None), stop, 600.0)
    soon, later = waits[:6], waits[6:]
    for i, wait in enumerate(soon):  # 10 s doubling to the interval, each give or take half
        assert 0.5 * min(10.0 * 2**i, 600.0) <= wait <= min(1.5 * 10.0 * 2**i, 600.0), soon
    assert all(300.0 <= w <= 900.0 for w in later), later


async def test_a_configuration_created_or_edited_is_given_the_ca_at_once() -> None:
    """The configuration's watch wakes the keeper whatever its wait (a configuration created an hour
    after the controller started waited up to --webhook-cert-interval for its caBundle)."""
    stop, changed = asyncio.Event(), asyncio.Event()
    passes: list[str] = []

    async def ensure(kube: Any, settings: Any) -> TlsPass:
        passes.append("pass")
        return TlsPass("current")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(webhook_tls, "ensure_webhook_tls", ensure)
        keeper = asyncio.create_task(keep_webhook_tls(cast(KubeClient, object()), cast(Any, None), stop, 600.0,
                                                      changed))
        while not passes:
            await asyncio.sleep(0)
        changed.set()
        async with asyncio.timeout(5):  # a wait of its interval (600 s) would time out here
            while len(passes) < 2:
                await asyncio.sleep(0)
        stop.set()
        await keeper
    assert passes == ["pass", "pass"]
