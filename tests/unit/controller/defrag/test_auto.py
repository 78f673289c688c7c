"""Auto defragmentation reads the cluster only when a pod of the policy's tenants has waited long
enough in the controller's watch of pods not yet on a node, and not again while nothing changed:
a fleet where nothing waits costs the API server nothing, whatever its tenants."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import pytest

from gpuslice.controller.defrag import auto as defrag_auto
from gpuslice.controller.defrag.auto import FAILED_PAUSE, Defragmenter
from gpuslice.controller.defrag.read import Reading
from gpuslice.controller.settings import ControllerSettings
from gpuslice.kube.client import KubeClient
from gpuslice.planning.defrag.model import Cluster

POLICY = {"metadata": {"name": "p"}, "spec": {"defragmentation": {"mode": "Auto", "minPendingSeconds": 60},
                                              "tenants": [{"namespace": f"t{i}"} for i in range(200)]}}


def pending(namespace: str, created: str, uid: str = "u1") -> dict[str, Any]:
    return {"metadata": {"name": "w", "namespace": namespace, "uid": uid, "creationTimestamp": created},
            "spec": {"resourceClaims": [{"name": "gpu"}]}, "status": {"phase": "Pending"}}


@dataclass
class Looks:
    """A Defragmenter on a clock and a watch version the test moves, and the policies it read the
    cluster for (the read itself stands in: an empty cluster)."""

    defrag: Defragmenter
    reads: list[str] = field(default_factory=list)
    now: float = 1.0
    version: int = 0


@pytest.fixture
def looks(monkeypatch: pytest.MonkeyPatch) -> Looks:
    made = Looks(cast(Defragmenter, None))
    made.defrag = Defragmenter(cast(KubeClient, object()), ControllerSettings(defrag_interval=30.0),
                               clock=lambda: made.now, version=lambda: made.version)

    async def read_cluster(kube: Any, policy: str | None = None, home: str = "gpuslice-system") -> Reading:
        made.reads.append(str(policy))
        return Reading([], Cluster([], [], [], [], {}, frozenset(), {}, ()), [])

    monkeypatch.setattr(defrag_auto, "read_cluster", read_cluster)
    return made


async def test_an_auto_look_reads_only_for_a_long_wait_and_only_when_something_changed(
        looks: Looks) -> None:
    defrag, reads = looks.defrag, looks.reads
    await defrag.auto(POLICY, [])  # nothing pending
    looks.now += 31
    await defrag.auto(POLICY, [pending("elsewhere", "2020-01-01T00:00:00Z")])  # not a tenant's
    looks.now += 31
    await defrag.auto(POLICY, [pending("t3", "2999-01-01T00:00:00Z")])  # has not waited a minute yet
    assert reads == []
    long_wait = [pending("t3", "2020-01-01T00:00:00Z")]
    looks.now += 31
    await defrag.auto(POLICY, long_wait)
    assert reads == ["p"]
    looks.now += 31
    await defrag.auto(POLICY, long_wait)  # the same pod, no claim or slice event: no read
    assert reads == ["p"]
    looks.version += 1
    looks.now += 31
    await defrag.auto(POLICY, long_wait)
    looks.now += 31
    await defrag.auto(POLICY, [*long_wait, pending("t4", "2020-01-01T00:00:00Z", "u2")])
    assert reads == ["p", "p", "p"]
    looks.now += FAILED_PAUSE
    await defrag.auto(POLICY, [*long_wait, pending("t4", "2020-01-01T00:00:00Z", "u2")])  # a paused claim's hour
    assert reads == ["p", "p", "p", "p"]


async def test_an_auto_look_is_woken_by_the_schedulers_verdict_on_a_pod_it_had_not_tried(
        looks: Looks) -> None:
    """A look that found the pod not yet tried (or gated) tells it nothing (D'); the scheduler turning
    it away for devices afterwards changes no claim, slice or pod UID, yet must be looked at."""
    defrag, reads = looks.defrag, looks.reads
    gated = pending("t3", "2020-01-01T00:00:00Z")
    gated["spec"]["schedulingGates"] = [{"name": "example.com/quota"}]
    await defrag.auto(POLICY, [gated])
    untried = pending("t3", "2020-01-01T00:00:00Z")
    looks.now += 31
    await defrag.auto(POLICY, [untried])  # its gate removed
    looks.now += 31
    await defrag.auto(POLICY, [untried])  # nothing said of it since
    assert reads == ["p", "p"]
    turned_away = pending("t3", "2020-01-01T00:00:00Z")
    turned_away["status"]["conditions"] = [{
        "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
        "message": "0/3 nodes are available: 3 cannot allocate all claims."}]
    looks.now += 31
    await defrag.auto(POLICY, [turned_away])
    assert reads == ["p", "p", "p"]


async def test_an_auto_look_is_woken_by_a_change_of_the_policys_defragmentation_settings(
        looks: Looks) -> None:
    """A pod told that the hour's budget is spent must be looked at again once the budget is raised,
    though no claim, slice or pod changed."""
    defrag, reads = looks.defrag, looks.reads
    waiting = [pending("t3", "2020-01-01T00:00:00Z")]
    await defrag.auto(POLICY, waiting)
    looks.now += 31
    await defrag.auto(POLICY, waiting)
    assert reads == ["p"]
    raised = {**POLICY, "spec": {**POLICY["spec"], "defragmentation": {
        "mode": "Auto", "minPendingSeconds": 60, "maxEvictionsPerHour": 12}}}
    looks.now += 31
    await defrag.auto(raised, waiting)
    assert reads == ["p", "p"]
