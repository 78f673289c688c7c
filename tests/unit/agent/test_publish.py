"""The publish cycle (agent.pool.NodePool.publish) against the fake API server, in seconds: an allocated
device is held as it was whatever the plan does, a refused policy is left out while the others
publish, the kubelet's wipe is undone from the record with every allocated device as it was, a pool
in its steady state writes nothing, and a drain waits for the API server's refusal of its probe.
The cluster tier (tests/cluster/agent) runs the same promises against a real API server and scheduler."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from gpuslice.agent.drain import PROBE
from gpuslice.agent.dryrun import GenerationRefused
from gpuslice.dra.names import CONTROLLER_NAMESPACE as NAMESPACE
from gpuslice.kube.client import Forbidden, KubeClient, ServerError
from tests import builders
from tests.fakeapi import FakeApi
from tests.unit.agent.pool import PENDING, TEN, TWENTY, Pool, refusing, taint_keys, without_taints


@pytest.fixture
def pool(api: FakeApi, kube: KubeClient, tmp_path: Path) -> Pool:
    return Pool.on(api, kube, tmp_path)


# An allocated device is held as it was while the plan changes.

Change = Callable[[Pool], None]


def resize(pool: Pool) -> None:
    pool.set_policy("p", TWENTY)


def to_shared(pool: Pool) -> None:
    pool.set_policy("p", {"mode": "shared", "sliceSize": "10G"})


def deselect(pool: Pool) -> None:
    pool.set_policy("p", TEN, node="another-node")


def delete(pool: Pool) -> None:
    pool.api.remove(f"{builders.POLICIES}/p")


def gpu_gone(pool: Pool) -> None:
    pool.gpus = []


CHANGES: dict[str, Change] = {"resized": resize, "to another mode": to_shared, "node no longer selected": deselect,
                              "policy deleted": delete, "GPU gone": gpu_gone}


@pytest.mark.parametrize("how", ["claim", "prepared"])
@pytest.mark.parametrize("change", CHANGES.values(), ids=CHANGES.keys())
async def test_an_allocated_device_is_held_as_it_was_while_the_plan_changes(pool: Pool, change: Change,
                                                                            how: str) -> None:
    pool.set_policy("p", TEN)
    await pool.settle()
    before = pool.devices()
    held = sorted(before)[3]
    if how == "claim":
        pool.allocate("c", held)
    else:  # prepared by the kubelet plugin, before the claim's status says so
        pool.hold(held)

    change(pool)
    result = await pool.settle()

    after = pool.devices()
    assert held in after, "an allocated device is never removed"
    assert without_taints(after[held]) == without_taints(before[held]), "nor changed"
    assert taint_keys(after[held]) == [PENDING], "it waits, tainted, for its claim"
    assert result.held == (held,)
    assert not set(before) - {held} & set(after), "every free device of the old plan is gone"


# A policy whose devices the API server refuses is left out; the others publish.


@pytest.mark.parametrize("code", [422, 403], ids=["refused naming the field", "refused by a rule naming none"])
@pytest.mark.parametrize("published_before", [False, True], ids=["new", "edited"])
async def test_a_refused_policy_is_left_out_while_the_others_publish(pool: Pool, code: int,
                                                                     published_before: bool) -> None:
    pool.set_policy("good", TEN)
    pool.set_policy("bad", TWENTY)
    if published_before:
        await pool.settle()
        pool.set_policy("bad", {"mode": "memory", "sliceSize": "40G"})  # an edit the server refuses
    was = pool.of("bad")
    pool.api.admit(refusing("bad", code))

    result = await pool.settle()

    assert result.refused == ("bad",)
    assert len(pool.of("good")) == 8
    assert pool.of("bad") == was, "its published devices stay exactly as they were; a new policy publishes none"
    asked = dry_runs(pool)
    assert not (await pool.publish()).changed
    assert dry_runs(pool) == asked, "refused once, not asked every cycle"


def dry_runs(pool: Pool) -> int:
    return len([r for r in pool.api.requests if r.dry_run])


async def test_a_write_refused_after_its_dry_run_said_yes_is_asked_about_again(pool: Pool) -> None:
    """A rule that comes between the dry run and the write (or another API server that judges
    otherwise) refuses the write: the next cycle asks again, and the refused policy is left out,
    rather than the same half generation written again on the strength of the earlier yes."""
    pool.set_policy("good", TEN)
    pool.set_policy("bad", TWENTY)
    rule = refusing("bad", 403)
    pool.api.admit(lambda request, obj: None if request.dry_run else rule(request, obj))
    with pytest.raises(Forbidden):
        await pool.publish()
    pool.api.admit(rule)

    result = await pool.settle()

    assert result.refused == ("bad",)
    assert len(pool.of("good")) == 8
    assert not pool.of("bad")


async def test_a_write_stored_without_fields_it_sent_is_asked_about_again(pool: Pool) -> None:
    """A republish within a dry run's yes is written without asking; the API server (a gate turned
    off since) stores it without its shared counters: the next cycle asks, and the server's drop
    is found, instead of the slices written again unasked."""
    pool.set_policy("p", TEN)
    await pool.settle()
    pool.api.drop("resourceslices", "spec.sharedCounters")
    for piece in pool.slices():
        pool.api.remove(f"{builders.SLICES}/{piece['metadata']['name']}")
    asked = dry_runs(pool)
    await pool.publish()  # the kubelet's wipe undone, the same content: no dry run
    assert dry_runs(pool) == asked

    with pytest.raises(GenerationRefused):
        await pool.publish()
    assert dry_runs(pool) > asked, "asked again once the write came back without what it sent"


# The kubelet wipes the pool (its plugin was away, or it restarted): the agent republishes from its
# record, every allocated device as it was.

@pytest.mark.parametrize("restarted", [False, True], ids=["same agent", "restarted agent"])
@pytest.mark.parametrize("held", [False, True], ids=["settled", "a change held for a claim"])
async def test_the_record_is_republished_after_the_kubelets_wipe(pool: Pool, held: bool, restarted: bool) -> None:
    pool.set_policy("p", TEN)
    await pool.settle()
    if held:
        pool.allocate("c", sorted(pool.devices())[0])
        pool.set_policy("p", TWENTY)
        await pool.settle()
    before, generation = pool.devices(), pool.generation()

    for piece in pool.slices():
        pool.api.remove(f"{builders.SLICES}/{piece['metadata']['name']}")
    if restarted:
        pool = pool.restarted()
    result = await pool.settle()

    assert pool.devices() == before, "every device comes back as it was, held ones in their old shape"
    assert result.generation > generation, "as a newer generation than any the scheduler saw"
    assert not (await pool.publish()).changed


# A pool in its steady state writes nothing: no slice, no drain list, no record.

def memory(pool: Pool) -> None:
    pool.set_policy("p", TEN)


def shared(pool: Pool) -> None:
    pool.set_policy("p", {"mode": "shared", "sliceSize": "10G"})


def dynamic_mig(pool: Pool) -> None:
    pool.set_policy("p", {"mode": "mig", "mig": {"profiles": ["1g.10gb", "3g.40gb"]}})


def two_policies(pool: Pool) -> None:
    pool.set_policy("p", TEN)
    pool.set_policy("q", TWENTY)


STEADY: dict[str, Change] = {"memory": memory, "shared": shared, "dynamic MIG": dynamic_mig,
                             "two policies": two_policies}


@pytest.mark.parametrize("waiting", ["nothing", "a held change", "a drain", "a refused policy", "a restart"])
@pytest.mark.parametrize("publishing", STEADY.values(), ids=STEADY.keys())
async def test_nothing_is_written_in_the_steady_state(pool: Pool, publishing: Change, waiting: str) -> None:
    publishing(pool)
    await pool.settle()
    if waiting == "a held change":
        pool.allocate("c", sorted(pool.devices())[0])
        pool.set_policy("p", {"mode": "memory", "sliceSize": "40G"})
    elif waiting == "a drain":
        pool.rule.in_force = False
        pool.set_policy("p", {"mode": "memory", "sliceSize": "40G"})
    elif waiting == "a refused policy":
        pool.api.admit(refusing("r", 422))
        pool.set_policy("r", {"mode": "memory", "sliceSize": "40G"})
    elif waiting == "a restart":
        pool = pool.restarted()
    since = len(pool.api.requests)
    await pool.settle()
    if waiting in ("nothing", "a restart"):
        assert pool.api.writes(since) == [], "a restarted agent rewrites nothing"
    devices, since = pool.devices(), len(pool.api.requests)

    for _ in range(3):
        assert not (await pool.publish()).changed

    assert pool.api.writes(since) == []
    assert pool.devices() == devices


# A device drains only once the API server refuses its probe: until then it stays, tainted and listed.

PROBES = f"/api/v1/namespaces/{NAMESPACE}/configmaps"
UNANSWERED = {
    "the rule not in force yet": None,
    "the probe forbidden by RBAC": (403, f'configmaps "{PROBE}" is forbidden: User "system:node:n1" cannot create'
                                         ' resource "configmaps"'),
    "the API server unavailable": (503, "etcdserver: request timed out"),
}


@pytest.mark.parametrize("answer", UNANSWERED.values(), ids=UNANSWERED.keys())
async def test_a_drain_waits_for_its_probe(pool: Pool, answer: tuple[int, str] | None) -> None:
    pool.set_policy("p", TEN)
    await pool.settle()
    before = set(pool.devices())
    pool.rule.in_force = False
    cue = pool.api.fail("POST", PROBES, *answer, dry_run=True, times=None) if answer else None

    pool.set_policy("p", TWENTY)
    if answer and answer[0] == 503:
        with pytest.raises(ServerError):  # a cycle fails and is tried again (agent.run's backoff)
            await pool.settle()
    else:
        await pool.settle()
    waiting = pool.devices()
    assert before <= set(waiting), "no old device goes before the API server refuses claims of it"
    assert all(taint_keys(waiting[d]) == [PENDING] for d in before), "they wait tainted: nothing new chooses them"
    assert pool.listed() == before, "and listed for the drain rule"
    assert pool.drains.due_in() is not None, "the agent asks again soon"

    pool.rule.in_force = True
    if cue is not None:
        cue.times = 0
    await pool.settle()
    after = pool.devices()
    assert sorted(after) == [n.replace("-10g-", "-20g-") for n in sorted(before)[:4]]
    assert not any(d.get("taints") for d in after.values())
    assert before <= pool.listed(), "a removed device stays listed a while, for a scheduler's late write"
