"""The kubelet plugin's start-up sweep (agent.kubeletplugin.recovery.recover) on a node with fake
GPUs, in seconds: a prepare killed half way is undone, a CDI spec and a dynamic MIG instance that
no checkpoint backs are removed, a static layout's instances are never touched, a checkpoint from
before the node's last boot is undone, and a completed claim keeps everything it has. The cluster
tier (tests/cluster/plugin/test_crash_safety.py) kills a real agent at the same points."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from gpuslice.agent.kubeletplugin.prepare import ClaimRef
from gpuslice.agent.kubeletplugin.recovery import Recovered, recover
from gpuslice.kube.client import KubeClient
from tests import builders
from tests.fakeapi import FakeApi
from tests.unit.agent.crash import killed_at
from tests.unit.agent.pool import Pool

KEPT = ClaimRef(builders.TENANT, "kept", "uid-kept")
OTHER = ClaimRef(builders.TENANT, "other", "uid-other")


@pytest.fixture
async def pool(api: FakeApi, kube: KubeClient, tmp_path: Path) -> Pool:
    """A dynamic MIG pool with one claim prepared (``KEPT``) and another allocated (``OTHER``)."""
    pool = Pool.on(api, kube, tmp_path)
    pool.set_policy("p", {"mode": "mig", "mig": {"profiles": ["1g.10gb"]}})
    await pool.settle()
    first, second = sorted(pool.devices())[:2]
    pool.allocate(KEPT.name, first, uid=KEPT.uid)
    pool.allocate(OTHER.name, second, uid=OTHER.uid)
    await pool.preparer().prepare(KEPT)
    return pool


Setup = Callable[[Pool, pytest.MonkeyPatch], Awaitable[object]]


async def started(pool: Pool, monkeypatch: pytest.MonkeyPatch) -> object:
    dying = pool.preparer()
    with killed_at("prepare-mig-created", dying, monkeypatch):
        await dying.prepare(OTHER)
    return {"undone": [f"{OTHER.namespace}/{OTHER.name}"]}


async def orphan_spec(pool: Pool, monkeypatch: pytest.MonkeyPatch) -> object:
    pool.preparer().cdi.write("uid-gone", {"cdiVersion": "0.8.0", "kind": "gpu.gpuslice.dev/gpu", "devices": []})
    return {"specs_removed": ["uid-gone"]}


async def orphan_instance(pool: Pool, monkeypatch: pytest.MonkeyPatch) -> object:
    [gpu] = pool.gpus
    profile = gpu.mig_profile("1g.10gb")
    assert profile is not None
    made = pool.backend.create_mig(gpu, profile, 6)  # what a crashed agent of an older version left
    return {"instances_destroyed": [f"{gpu.uuid}/1g.10gb@{made.start}"]}


async def earlier_boot(pool: Pool, monkeypatch: pytest.MonkeyPatch) -> object:
    await pool.preparer(boot_id="boot-0").prepare(OTHER)
    return {"rebooted": [f"{OTHER.namespace}/{OTHER.name}"]}


SWEPT: dict[str, Setup] = {"a prepare killed half way": started, "a CDI spec no checkpoint backs": orphan_spec,
                           "a dynamic MIG instance no checkpoint backs": orphan_instance,
                           "a checkpoint from an earlier boot": earlier_boot}


@pytest.mark.parametrize("setup", SWEPT.values(), ids=SWEPT.keys())
async def test_recovery_undoes_what_no_completed_checkpoint_backs(pool: Pool, setup: Setup,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    kept = pool.instances()
    expected = await setup(pool, monkeypatch)
    preparer = pool.preparer()

    found = await recover(preparer, {g.uuid for g in pool.gpus})

    assert {k: v for k, v in vars(found).items() if v} == expected
    assert [c.uid for c in preparer.checkpoints.all()] == [KEPT.uid]
    assert preparer.cdi.claims() == {KEPT.uid}
    assert pool.instances() == kept, "the completed claim keeps its instance, and only it is left"
    assert await recover(preparer, {g.uuid for g in pool.gpus}) == Recovered(), "and the next sweep finds nothing"


@pytest.mark.parametrize("layout", ["static", "not dynamic"], ids=["a static layout's GPU", "a GPU that published"
                                                                  " no dynamic MIG"])
async def test_instances_recovery_does_not_own_are_never_touched(pool: Pool, layout: str) -> None:
    [gpu] = pool.gpus
    profile = gpu.mig_profile("1g.10gb")
    assert profile is not None
    pool.backend.create_mig(gpu, profile, 6)  # the MIG manager made it, or an operator by hand
    before = pool.instances()
    static = {gpu.uuid} if layout == "static" else set()  # the MIG manager's
    dynamic = {gpu.uuid} if layout == "static" else set()  # GPUs whose last published devices were MIG ones

    found = await recover(pool.preparer(static=static), dynamic)

    assert found.instances_destroyed == []
    assert pool.instances() == before


async def test_the_stale_claims_sweep_asks_only_about_claims_no_container_holds(pool: Pool, api: FakeApi) -> None:
    """Every sweep (every resync) read every prepared claim from the API server: a node's claims a
    minute, for ever. A claim the kubelet says a running container holds is reserved, so it exists:
    it is not asked about; one no container holds is, and unprepared when it is gone."""
    from gpuslice.agent.kubeletplugin.recovery import collect_stale

    preparer = pool.preparer()
    key = f"{KEPT.namespace}/{KEPT.name}"
    since = len(api.requests)
    assert await collect_stale(preparer, {key}) == []
    assert [str(r) for r in api.requests[since:]] == []
    api.remove(f"/apis/resource.k8s.io/v1/namespaces/{KEPT.namespace}/resourceclaims/{KEPT.name}")
    assert await collect_stale(preparer, set()) == [key]  # no container holds it, and it is gone
