"""Hostile review, December (third round), P's fix against the controller itself: after a restart
(SIGKILL), the controller still writes every part of a policy's status that the admission rule
gpuslice-policy-status keeps to it alone.

The rule spares one username, the controller's ServiceAccount; everyone else, a cluster admin
included, may only add or remove moves. Checked here, after the controller was killed and started
again: the records limits are judged against (classesInForce, admittedTenants) follow a spec
change, and a move recorded by someone else that can no longer be carried out (its claim is gone)
is removed by the controller, which writes the outcome (defragmentation.last). A promise test: it
passes while the controller's writes go through.
"""

from __future__ import annotations

import datetime
import uuid
from typing import Any

from gpuslice.api.status import DefragMove, ObjectRef
from gpuslice.controller.defrag.move import now_utc, stamp, start
from gpuslice.kube.client import KubeClient
from tests.cluster.gpu_nodes import GpuNodeFactory
from tests.cluster.kubeutil import wait_for
from tests.cluster.operator_fixtures import ControllerProcess, PolicyFactory
from tests.cluster.pools import published
from tests.cluster.tenancy import ready_tenant

POLICIES = "/apis/gpuslice.dev/v1alpha1/gpuslicepolicies"


async def test_the_controller_writes_its_records_and_ends_moves_after_a_restart(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, gpu_node: GpuNodeFactory,
    namespace: str, namespaces: Any,
) -> None:
    other = await namespaces("late")
    node = await gpu_node("h100-80gb", 1)
    name = str((await make_policy({"nodeSelector": {"matchLabels": {"kubernetes.io/hostname": node.name}},
                                   "slicing": {"mode": "shared", "sliceSize": "10G"},
                                   "tenants": [{"namespace": namespace, "maxSlices": 1}]}))["metadata"]["name"])
    await published(kube, node.name, 1)
    await ready_tenant(kube, name, namespace)
    before = (await kube.get(f"{POLICIES}/{name}"))["status"]
    print("S0 classesInForce before:", before.get("classesInForce"))
    await controller.restart(9)  # SIGKILL: mid-whatever it was doing

    async def started() -> bool:
        return controller.log_text().count("controller started") >= 2

    await wait_for(started, within=60, what="the controller to start again")
    await kube.merge_patch(f"{POLICIES}/{name}", {"spec": {
        "slicing": {"mode": "shared", "sliceSize": "20G"},
        "tenants": [{"namespace": namespace, "maxSlices": 1}, {"namespace": other}]}})

    async def recorded() -> dict[str, Any] | None:
        status = (await kube.get(f"{POLICIES}/{name}")).get("status") or {}
        memory = {c["name"]: c.get("memory") for c in status.get("classesInForce") or []}
        tenants = {a["namespace"] for a in status.get("admittedTenants") or []}
        return status if memory.get(f"{name}.gpuslice.dev") == "20G" and other in tenants else None

    status = await wait_for(recorded, within=90, what="classesInForce and admittedTenants to follow the spec")
    print("S1 after the restart: classesInForce", status.get("classesInForce"), "| admittedTenants",
          [a["namespace"] for a in status.get("admittedTenants") or []])
    # A move recorded by the cluster admin (any identity but the controller may add one) for a claim that
    # is not there: the controller ends it and writes the outcome, a field only it may write.
    now = now_utc()
    move = DefragMove(id=f"d-{uuid.uuid4().hex[:10]}", node=node.name, gpu="GPU-none", gpu_tag="gpu-00000000",
                      device="x", claim=ObjectRef(namespace=namespace, name="gone", uid=str(uuid.uuid4())),
                      pod=ObjectRef(namespace=namespace, name="gone", uid=str(uuid.uuid4())),
                      by="a test", started=stamp(now), expires=stamp(now + datetime.timedelta(minutes=5)))
    assert await start(kube, name, move, []) is None

    async def ended() -> dict[str, Any] | None:
        found = ((await kube.get(f"{POLICIES}/{name}")).get("status") or {}).get("defragmentation") or {}
        return found if not found.get("inFlight") and (found.get("last") or {}).get("id") == move.id else None

    last = await wait_for(ended, within=60, what="the controller to end the move and write its outcome")
    print("S2 the controller ended the move:", last.get("last"))
    denied = [line for line in controller.log_text().splitlines() if "gpuslice-policy-status" in line]
    print("S3 controller log lines naming gpuslice-policy-status:", denied[:3])
    assert not denied, denied
