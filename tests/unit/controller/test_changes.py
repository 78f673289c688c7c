"""The status timer refreshes a policy only when something it reads has changed."""

from __future__ import annotations

from gpuslice.controller.changes import Changes
from gpuslice.planning.reads.usage import ClaimView, SliceView


def _slice(pool: str, devices: dict[str, str]) -> SliceView:
    return SliceView(pool, 1, tuple(devices.items()))


def _claim(name: str, *devices: tuple[str, str]) -> ClaimView | None:
    results = [{"driver": "gpu.gpuslice.dev", "pool": pool, "device": device} for pool, device in devices]
    return ClaimView.from_claim("team", name, {"allocation": {"devices": {"results": results}}})


def test_every_policy_is_refreshed_once_then_only_what_changed() -> None:
    changes = Changes()
    assert changes.take("a")
    assert changes.take("b")
    assert not changes.take("a")
    assert not changes.take("b")
    changes.slice_seen(_slice("n1", {"d1": "a", "d2": "b"}))
    assert changes.take("a")
    assert changes.take("b")
    changes.claim_seen(("team", "c"), _claim("c", ("n1", "d1")))
    assert changes.take("a")
    assert not changes.take("b")


def test_a_released_claim_marks_the_policy_it_held() -> None:
    changes = Changes()
    changes.slice_seen(_slice("n1", {"d1": "a"}))
    changes.claim_seen(("team", "c"), _claim("c", ("n1", "d1")))
    changes.take("a")
    changes.claim_seen(("team", "c"), None)  # allocation removed: the event no longer names d1
    assert changes.take("a")


def test_node_heartbeats_change_nothing_but_labels_change_everything() -> None:
    changes = Changes()
    changes.node_seen("n1", {"gpu": "h100"})
    changes.take("a")
    changes.node_seen("n1", {"gpu": "h100"})  # a status update: same labels
    assert not changes.take("a")
    changes.node_seen("n1", {"gpu": "h100", "pool": "x"})
    assert changes.take("a")
    changes.node_seen("n1", None)
    assert changes.take("a")
