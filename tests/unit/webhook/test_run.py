"""The webhook's recount loop outlives any failed pass: it alone releases the charges of
allocation writes that never happened, so a loop that died would leave a tenant waiting below
its limit for good (seen once in CI: a rush stalled after the webhook was killed mid-request)."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
from types import SimpleNamespace
from typing import Any

import pytest

from gpuslice.webhook.metrics import RECKON_FAILURES
from gpuslice.webhook.run import TaskEnded, _reckon_loop, _until_stop_or_task_ends


class FlakyLedgers:
    def __init__(self, failures: list[BaseException]) -> None:
        self.failures, self.calls = failures, 0
        self.done = asyncio.Event()

    async def reckon_ledger(self, name: str, grace: datetime.timedelta) -> None:
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)
        self.done.set()


def state() -> Any:
    ledger = SimpleNamespace(in_force=False, spec=SimpleNamespace(namespace="team-a"))
    return SimpleNamespace(changed=asyncio.Event(), dirty=set(), ledgers=SimpleNamespace(items={"p.team-a": ledger}))


@pytest.mark.looptime  # the loop's pauses (a second after each failure) pass on fake loop time
@pytest.mark.asyncio(loop_scope="function")  # its own loop: a task another test left on the shared one keeps fake time from jumping
async def test_a_recount_that_fails_unexpectedly_is_tried_again_and_counted() -> None:
    ledgers, stop = FlakyLedgers([KeyError("a bug"), ValueError("another")]), asyncio.Event()
    before = RECKON_FAILURES._value.get()
    loop = asyncio.create_task(_reckon_loop(ledgers, state(), stop, SimpleNamespace(resync=0.05, charge_grace=0.1)))  # type: ignore[arg-type]
    await asyncio.wait_for(ledgers.done.wait(), 10)
    stop.set()
    await asyncio.wait_for(loop, 5)
    assert ledgers.calls >= 3
    assert RECKON_FAILURES._value.get() - before == 2


async def test_a_task_of_the_webhook_that_ends_ends_the_process() -> None:
    async def dies() -> None:
        raise RuntimeError("the cache's watch gave up")

    task = asyncio.create_task(dies(), name="caches")
    with pytest.raises(TaskEnded, match="caches task ended"):
        await asyncio.wait_for(_until_stop_or_task_ends(asyncio.Event(), [task]), 5)


async def test_a_stop_ends_the_tasks_and_is_no_failure() -> None:
    """The tasks watch ``stop`` too, and end in the same turn as the wait for it (the certificates'
    loop does, on Python 3.12's wait_for): that is a shutdown, not a task that died."""
    stop = asyncio.Event()

    async def keeps() -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(30):
                    await stop.wait()

    tasks = [asyncio.create_task(keeps(), name=name) for name in ("caches", "certificates", "recounts")]
    asyncio.get_running_loop().call_later(0.05, stop.set)
    await asyncio.wait_for(_until_stop_or_task_ends(stop, tasks), 5)
    await asyncio.gather(*tasks)
