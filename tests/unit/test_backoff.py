"""The one backoff: doubling to a bound, spread by half either way, never past the bound."""

from __future__ import annotations

from gpuslice.backoff import Backoff, spread


def test_each_failure_doubles_the_wait_up_to_the_limit_spread_by_half_either_way() -> None:
    backoff = Backoff(1.0, 10.0)
    assert backoff.after(0) == 0.0
    for failures, bare in [(1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (5, 10.0), (50, 10.0)]:
        waits = [backoff.after(failures) for _ in range(200)]
        assert all(0.5 * bare <= w <= min(1.5 * bare, 10.0) for w in waits), (failures, min(waits), max(waits))
        assert len(set(waits)) > 1, "spread: a fleet does not try again in step"


def test_as_a_counter_it_resets_after_a_success_and_never_overflows() -> None:
    backoff = Backoff(0.5, 60.0, jitter=False)
    assert [backoff.next() for _ in range(5)] == [0.5, 1.0, 2.0, 4.0, 8.0]
    assert backoff.current == 8.0
    backoff.reset()
    assert backoff.next() == 0.5
    assert Backoff(0.5, 60.0, jitter=False).after(100_000) == 60.0, "failing for days is no float overflow"


def test_spread_is_the_one_jitter_rule() -> None:
    assert all(5.0 <= spread(10.0) <= 15.0 for _ in range(200))
