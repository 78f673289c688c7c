"""The kubelet plugin's prepare and unprepare (agent.kubeletplugin.prepare.Preparer) against the fake
API server and fake GPUs, in seconds: a retry is answered from a completed checkpoint, a retry after
a prepare killed half way undoes it first, a claim the plugin must refuse leaves nothing behind,
and unprepare always succeeds. The cluster tier (tests/cluster/plugin) runs them with a real
kubelet's calls, kill points in a real process and a real scheduler."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpuslice.agent.kubeletplugin.errors import (
    ClaimNotFound,
    DeviceHeld,
    DeviceNotPublished,
    NotAllocated,
    NotATenant,
    PluginError,
)
from gpuslice.agent.kubeletplugin.prepare import ClaimRef, Preparer
from gpuslice.dra import cdi
from gpuslice.kube.client import KubeClient
from tests import builders
from tests.fakeapi import FakeApi
from tests.unit.agent.crash import killed_at
from tests.unit.agent.pool import Pool

MODES = {
    "memory": {"mode": "memory", "sliceSize": "10G"},
    "shared": {"mode": "shared", "sliceSize": "10G"},
    "dynamic MIG": {"mode": "mig", "mig": {"profiles": ["1g.10gb"]}},
}
SHARE = {"shareID": "00000000-0000-0000-0000-000000000001", "consumedCapacity": {"memory": "10G"}}
CLAIM = ClaimRef(builders.TENANT, "c", "uid-c")


@pytest.fixture
async def pool(api: FakeApi, kube: KubeClient, tmp_path: Path) -> Pool:
    return Pool.on(api, kube, tmp_path)


async def published(pool: Pool, mode: str) -> str:
    """Publish policy ``p`` in ``mode``; the name of a device of it."""
    pool.set_policy("p", MODES[mode], adminAccess={"namespaces": ["ops"]})
    await pool.settle()
    return sorted(pool.devices())[0]


def allocate(pool: Pool, mode: str, device: str, claim: dict[str, Any] | None = None) -> None:
    """Claim ``c`` allocated ``device`` (``claim``: how it differs from a tenant's claim of this node)."""
    pool.allocate("c", device, **(SHARE if mode == "shared" else {}), **(claim or {}))


def left_behind(pool: Pool, preparer: Preparer) -> tuple[list[str], set[str], list[tuple[str, int, str]]]:
    """What a claim's prepare left on the node: checkpoints, CDI specs, MIG instances."""
    return [c.uid for c in preparer.checkpoints.all()], preparer.cdi.claims(), pool.instances()


@pytest.mark.parametrize("mode", MODES)
async def test_a_retry_is_answered_from_the_completed_checkpoint(pool: Pool, mode: str) -> None:
    allocate(pool, mode, await published(pool, mode))
    preparer = pool.preparer()
    first = await preparer.prepare(CLAIM)
    spec = preparer.cdi.path(CLAIM.uid).read_text()
    made, since = pool.instances(), len(pool.api.requests)

    for again in (preparer, pool.preparer()):  # the kubelet retried, or it restarted and asks again
        assert await again.prepare(CLAIM) == first

    assert pool.api.requests[since:] == [], "answered from the node, without a read"
    assert preparer.cdi.path(CLAIM.uid).read_text() == spec
    assert pool.instances() == made, "nothing made twice"
    assert [d.cdi_ids for d in first] == [[cdi.qualified(cdi.device_name(CLAIM.uid, first[0].device))]]


@pytest.mark.parametrize(("mode", "point"), [
    ("memory", "prepare-started"), ("memory", "prepare-cdi-written"),
    ("dynamic MIG", "prepare-started"), ("dynamic MIG", "prepare-mig-created"), ("dynamic MIG", "prepare-cdi-written"),
])
async def test_a_retry_after_a_started_checkpoint_undoes_it_first(pool: Pool, mode: str, point: str,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    allocate(pool, mode, await published(pool, mode))
    dying = pool.preparer()
    with killed_at(point, dying, monkeypatch):
        await dying.prepare(CLAIM)
    [started] = dying.checkpoints.all()
    assert started.phase == "started"
    orphans = pool.instances()

    devices = await pool.preparer().prepare(CLAIM)  # the agent is back; the kubelet asks again

    [done] = dying.checkpoints.all()
    assert done.phase == "completed"
    assert dying.cdi.claims() == {CLAIM.uid}
    if mode == "dynamic MIG":
        [(profile, start, uuid)] = pool.instances()
        assert devices[0].mig is not None
        assert (profile, start, uuid) == (devices[0].mig.profile, devices[0].mig.start, devices[0].mig.uuid)
        assert all(uuid != orphan[2] for orphan in orphans), "the half-made instance was destroyed, then made anew"
    else:
        assert pool.instances() == []


def unpublished(pool: Pool, mode: str, device: str) -> None:
    """The scheduler chose ``device``; a policy edit removed it before the allocation was written."""
    pool.set_policy("p", {**MODES[mode], "sliceSize": "20G"} if "sliceSize" in MODES[mode]
                    else {"mode": "mig", "mig": {"profiles": ["2g.20gb"]}})


REFUSED: dict[str, tuple[type[PluginError], str, dict[str, Any]]] = {
    "a device no longer published": (DeviceNotPublished, "which the gpuslice agent on n1 no longer publishes", {}),
    "a namespace the policy does not name": (NotATenant, "namespace intruders is not in its spec.tenants",
                                             {"namespace": "intruders"}),
    "admin access the policy does not grant": (NotATenant, "is not in its spec.adminAccess.namespaces",
                                               {"admin": True}),
    "a claim recreated since": (ClaimNotFound, "was deleted and recreated", {"uid": "uid-new"}),
    "devices of another node": (NotAllocated, "of pools n2, not only of node n1's pool", {"pool": "n2"}),
}


@pytest.mark.parametrize("mode", ["memory", "dynamic MIG"])
@pytest.mark.parametrize("refused", REFUSED.values(), ids=REFUSED.keys())
async def test_a_refused_claim_leaves_nothing_behind(pool: Pool, mode: str,
                                                     refused: tuple[type[PluginError], str, dict[str, Any]]) -> None:
    error, words, claim = refused
    device = await published(pool, mode)
    if error is DeviceNotPublished:
        unpublished(pool, mode, device)
        await pool.settle()
        assert device not in pool.devices()
    namespace = claim.get("namespace", builders.TENANT)
    allocate(pool, mode, device, claim)
    preparer = pool.preparer()

    with pytest.raises(error, match=words):
        await preparer.prepare(ClaimRef(namespace, "c", "uid-c"))

    assert left_behind(pool, preparer) == ([], set(), [])


@pytest.mark.parametrize("case", ["never prepared", "a crashed prepare's spec", "prepared", "unprepared twice"])
async def test_unprepare_succeeds_and_removes_what_prepare_made(pool: Pool, case: str) -> None:
    allocate(pool, "dynamic MIG", await published(pool, "dynamic MIG"))
    preparer = pool.preparer()
    if case == "a crashed prepare's spec":
        preparer.cdi.write(CLAIM.uid, {"cdiVersion": "0.8.0", "kind": "gpu.gpuslice.dev/gpu", "devices": []})
    elif case in ("prepared", "unprepared twice"):
        await preparer.prepare(CLAIM)
        assert pool.instances()
    if case == "unprepared twice":
        await preparer.unprepare(CLAIM)

    await pool.preparer().unprepare(CLAIM)

    assert left_behind(pool, preparer) == ([], set(), [])


HELD = {
    "the same slice": ("memory", lambda names: (names[0], names[0]), {}),
    "a whole GPU beside a slice of it": ("memory", lambda names: (next(n for n in names if n.endswith("-full")),
                                                                  next(n for n in names if "-full" not in n)), {}),
    "shares beyond the shared device": ("shared", lambda names: (names[0], names[0]),
                                        {"consumedCapacity": {"memory": "80G"}}),
    "the same MIG placement": ("dynamic MIG", lambda names: (names[0], names[0]), {}),
}


@pytest.mark.parametrize("case", HELD.values(), ids=HELD.keys())
async def test_a_device_a_prepared_claim_holds_is_never_prepared_for_another(pool: Pool, case: Any) -> None:
    """Whatever the allocation says (the scheduler's stale state, a forced pod deletion, a forged
    status): the first claim keeps its device, the second gets nothing and leaves nothing."""
    mode, pick, first_share = case
    pool.set_policy("p", {**MODES[mode], **({"allowFullGpu": True} if mode == "memory" else {})})
    await pool.settle()
    held, asked = pick(sorted(pool.devices()))
    share = {**SHARE, **first_share} if mode == "shared" else {}
    pool.allocate("c", held, **share)
    preparer = pool.preparer()
    await preparer.prepare(CLAIM)
    pool.allocate("d", asked, **({**SHARE, "shareID": "00000000-0000-0000-0000-000000000002"} if mode == "shared"
                                 else {}))
    second = ClaimRef(builders.TENANT, "d", "uid-d")

    with pytest.raises(DeviceHeld, match=f"claim {CLAIM} \\(uid {CLAIM.uid}\\)|counter set"):
        await pool.preparer().prepare(second)

    assert [c.uid for c in preparer.checkpoints.all()] == [CLAIM.uid]
    assert preparer.cdi.claims() == {CLAIM.uid}


async def test_shares_within_the_device_and_admin_access_are_prepared_beside_a_held_device(pool: Pool) -> None:
    pool.set_policy("p", MODES["shared"], adminAccess={"namespaces": ["ops"]})
    await pool.settle()
    [device] = sorted(pool.devices())[:1]
    pool.allocate("c", device, **SHARE)
    preparer = pool.preparer()
    await preparer.prepare(CLAIM)
    pool.allocate("d", device, **{**SHARE, "shareID": "00000000-0000-0000-0000-000000000002"})
    pool.api.put(builders.claim("watch", [device], namespace="ops", admin=True))

    await preparer.prepare(ClaimRef(builders.TENANT, "d", "uid-d"))
    await preparer.prepare(ClaimRef("ops", "watch", "uid-watch"))

    assert {c.uid for c in preparer.checkpoints.all()} == {CLAIM.uid, "uid-d", "uid-watch"}
