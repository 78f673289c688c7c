"""Two copies of the controller never act at the same time: the one holding the Lease acts, the
other waits; a killed leader's successor takes over; a frozen leader that thaws stops before it writes."""

from __future__ import annotations

import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest

from gpuslice.kube.client import KubeClient
from tests.cluster.kubeutil import NO_NODES, RESOURCE, get_or_none, wait_for
from tests.cluster.observe import log_entries
from tests.cluster.operator_fixtures import LEASE_ENV, ControllerProcess, PolicyFactory

LEASE = "/apis/coordination.k8s.io/v1/namespaces/gpuslice-system/leases/gpuslice-controller"


def holder_of(text: str, event: str) -> str | None:
    """The holder a controller's log says it is when it logs ``event`` last (the log of a controller
    restarted by an earlier test holds its earlier lives too)."""
    return next((str(e.get("holder")) for e in reversed(log_entries(text)) if e.get("event") == event), None)


async def lease_holder(kube: KubeClient) -> str:
    return str(((await kube.get(LEASE)).get("spec") or {}).get("holderIdentity") or "")


@pytest.fixture
async def second(controller: ControllerProcess, controller_kubeconfig: Path, kube: KubeClient,
                 tmp_path: Path) -> AsyncIterator[ControllerProcess]:
    """Another copy of the controller, as a second replica would be; the session's copy is back as the
    leader afterwards."""
    other = ControllerProcess(controller_kubeconfig, tmp_path / "second.log")
    other.start()
    yield other
    since = len(controller.log_text())
    await other.stop()
    if controller.process is None or controller.process.poll() is not None:
        controller.process = None
        controller.start()

    async def leading() -> bool:
        if any(e.get("event") == "controller started" for e in log_entries(controller.log_text()[since:])):
            return True  # (re)started, or a follower that took over
        mine = holder_of(controller.log_text(), "leading: this controller acts")
        return mine is not None and await lease_holder(kube) == mine  # led all along

    await wait_for(leading, within=60, what="the session's controller to lead again")


async def test_a_second_copy_waits_and_takes_over_when_the_leader_is_killed(
    kube: KubeClient, controller: ControllerProcess, second: ControllerProcess, make_policy: PolicyFactory,
    namespaces: Callable[..., Awaitable[str]],
) -> None:
    await wait_for(lambda: _logged(second, "another controller leads; waiting"), within=30,
                   what="the second copy to wait for the Lease")
    # What the Deployment's probes ask, on the port they ask it: the waiting copy is alive and ready
    # (a standby that failed them would be restarted in a loop, and hold up rollouts and drains).
    assert await health(second, "/healthz") == (200, "ok\n")
    assert await health(second, "/readyz") == (200, "ok\n")
    leader = await lease_holder(kube)
    assert leader == holder_of(controller.log_text(), "leading: this controller acts")
    tenant = await namespaces("lead")
    first = await make_policy({"nodeSelector": NO_NODES, "slicing": {"mode": "memory", "sliceSize": "10Gi"},
                               "tenants": [{"namespace": tenant}]}, "-a")
    await wait_for(lambda: get_or_none(kube, f"{RESOURCE}/deviceclasses/{first['metadata']['name']}.gpuslice.dev"),
                   what="the leader to make the first policy's class")
    assert "controller started" not in second.log_text(), "the waiting copy started acting"
    assert first["metadata"]["name"] not in second.log_text(), "the waiting copy touched a policy"

    await controller.stop(signal.SIGKILL)  # no chance to give the Lease up
    took = await wait_for(lambda: _logged(second, "controller started"), within=float(LEASE_ENV["GPUSLICE_LEASE_DURATION"])
                          + 30, what="the second copy to take over")
    assert took
    assert await lease_holder(kube) == holder_of(second.log_text(), "leading: this controller acts") != leader
    later = await make_policy({"nodeSelector": NO_NODES, "slicing": {"mode": "memory", "sliceSize": "10Gi"},
                               "tenants": [{"namespace": tenant}], "claimTemplateName": "later"}, "-b")
    await wait_for(lambda: get_or_none(kube, f"{RESOURCE}/deviceclasses/{later['metadata']['name']}.gpuslice.dev"),
                   what="the new leader to act on a new policy")


async def test_a_frozen_leader_stops_when_it_thaws_and_writes_nothing(
    kube: KubeClient, controller: ControllerProcess, second: ControllerProcess, make_policy: PolicyFactory,
    namespaces: Callable[..., Awaitable[str]],
) -> None:
    await wait_for(lambda: _logged(second, "another controller leads; waiting"), within=30,
                   what="the second copy to wait for the Lease")
    tenant = await namespaces("thaw")
    controller.pause()  # SIGSTOP: a leader that hangs, or a VM paused, past its Lease
    thawed = False
    try:
        await wait_for(lambda: _logged(second, "controller started"), within=60,
                       what="the second copy to take the Lease from the frozen one")
        policy = await make_policy({"nodeSelector": NO_NODES, "slicing": {"mode": "memory", "sliceSize": "10Gi"},
                                    "tenants": [{"namespace": tenant}]})
        name = policy["metadata"]["name"]
        # The policy (status, Kopf's annotations and finalizer), what it made, and the Lease (no renewal).
        objects = [f"/apis/gpuslice.dev/v1alpha1/gpuslicepolicies/{name}", f"{RESOURCE}/deviceclasses/{name}.gpuslice.dev",
                   f"{RESOURCE}/namespaces/{tenant}/resourceclaimtemplates/gpu-slice", LEASE]

        async def converged() -> bool:
            body = await kube.get(objects[0])
            status = body.get("status") or {}
            return bool(status.get("observedGeneration") == body["metadata"]["generation"]
                        and await get_or_none(kube, objects[2]))

        await wait_for(converged, within=60, what="the new leader to converge the policy")
        # Now only the thawed copy could write: the new leader is frozen in its turn.
        second.pause()
        # A write the new leader sent just before it froze can still land: the versions taken are
        # those that two reads a second apart agree on.
        seen: list[dict[str, str]] = []

        async def quiet() -> dict[str, str] | None:
            seen.append({path: (await kube.get(path))["metadata"]["resourceVersion"] for path in objects})
            return seen[-1] if len(seen) > 1 and seen[-1] == seen[-2] else None

        versions = await wait_for(quiet, within=30, what="the frozen leader's last writes to land", every=1.0)
        before = controller.log_text()
        controller.resume()
        thawed = True

        async def exited() -> int | None:
            assert controller.process is not None
            return controller.process.poll()

        status = await wait_for(exited, within=30, what="the thawed copy to exit")
        assert {path: (await kube.get(path))["metadata"]["resourceVersion"] for path in objects} == versions, \
            "the thawed copy wrote"
    finally:
        if not thawed:
            controller.resume()
        second.resume()
    assert status == 1
    after = log_entries(controller.log_text()[len(before):])
    assert any(e.get("event") == "lost the leader Lease: this controller stops acting" for e in after)
    assert all(e.get("event") != "controller started" for e in after)
    assert await lease_holder(kube) == holder_of(second.log_text(), "leading: this controller acts")


async def health(process: ControllerProcess, path: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session, \
            session.get(f"http://127.0.0.1:{process.metrics_port}{path}") as response:
        return response.status, await response.text()


async def _logged(process: ControllerProcess, event: str) -> bool:
    return any(e.get("event") == event for e in log_entries(process.log_text()))
