"""Fake GPU nodes that run pods through the kubelet's own plugin manager and DRA manager.

A cluster of its own (pod runners, node-lifecycle and taint-eviction controllers), so that
stopping a runner here does not disturb the other tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gpuslice.devcluster import binaries
from gpuslice.devcluster.cluster import ClusterSpec, DevCluster
from gpuslice.devcluster.nodes import fake_gpu_node
from gpuslice.devcluster.process import Component
from gpuslice.kube.client import KubeClient, KubeError
from tests.cluster.kubeutil import (
    PAUSE_IMAGE,
    RESOURCE,
    claim_template,
    create_namespace,
    dev_cluster,
    device_class,
    device_slice,
    pod_with_claim,
    wait_for,
)
from tests.cluster.podrunner.testplugin import DraTestPlugin

NODE = "gpu-node-1"


@pytest.fixture(scope="module")
async def runner_cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[DevCluster]:
    spec = ClusterSpec(tmp_path_factory.mktemp("runner-cluster"), nodes=1, gpus_per_node=1, pod_runner=True)
    async with dev_cluster(spec) as cluster:
        yield cluster


@pytest.fixture(scope="module")
async def rkube(runner_cluster: DevCluster) -> AsyncIterator[KubeClient]:
    async with await KubeClient.from_kubeconfig(runner_cluster.kubeconfig) as client:
        yield client


@pytest.fixture
async def rns(rkube: KubeClient, unique: str) -> AsyncIterator[str]:
    name = await create_namespace(rkube, f"r-{unique}")
    yield name
    await rkube.delete(f"/api/v1/namespaces/{name}")


def plain_pod(name: str, node: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": PAUSE_IMAGE}]}
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


async def phase(kube: KubeClient, ns: str, pod: str) -> str | None:
    try:
        return str((await kube.get(f"/api/v1/namespaces/{ns}/pods/{pod}")).get("status", {}).get("phase"))
    except KubeError as error:
        if error.status == 404:
            return None
        raise


async def gone(kube: KubeClient, path: str) -> bool:
    try:
        await kube.get(path)
    except KubeError as error:
        return error.status == 404
    return False


async def events(kube: KubeClient, ns: str, pod: str) -> list[dict[str, Any]]:
    return [e for e in await kube.list(f"/api/v1/namespaces/{ns}/events") if e["involvedObject"]["name"] == pod]


async def test_pod_without_claims_runs_and_is_deleted_and_needs_a_runner(rkube: KubeClient, rns: str) -> None:
    await rkube.create(f"/api/v1/namespaces/{rns}/pods", plain_pod("plain"))
    await wait_for(lambda: _is(phase(rkube, rns, "plain"), "Running"), what="the pod to be Running")
    pod = await rkube.get(f"/api/v1/namespaces/{rns}/pods/plain")
    conditions = {c["type"]: c["status"] for c in pod["status"]["conditions"]}
    assert conditions["Ready"] == "True"
    assert pod["status"]["containerStatuses"][0]["state"]["running"]

    await rkube.delete(f"/api/v1/namespaces/{rns}/pods/plain")  # graceful, as a user deletes
    await wait_for(lambda: gone(rkube, f"/api/v1/namespaces/{rns}/pods/plain"), what="the runner to finish deletion")

    await rkube.create("/api/v1/nodes", fake_gpu_node(f"{rns}-no-runner", "l4", 1))
    try:
        await rkube.create(f"/api/v1/namespaces/{rns}/pods", plain_pod("stranded", node=f"{rns}-no-runner"))
        # A pod made after it runs: the runner has seen the stranded one, and left it alone.
        await rkube.create(f"/api/v1/namespaces/{rns}/pods", plain_pod("later"))
        await wait_for(lambda: _is(phase(rkube, rns, "later"), "Running"), what="the later pod to be Running")
        assert await phase(rkube, rns, "stranded") == "Pending", "without a runner a bound pod never runs"
    finally:
        await rkube.delete(f"/api/v1/namespaces/{rns}/pods/stranded", gracePeriodSeconds=0)
        with contextlib.suppress(KubeError):
            await rkube.delete(f"/api/v1/namespaces/{rns}/pods/later", gracePeriodSeconds=0)
        await rkube.delete(f"/api/v1/nodes/{rns}-no-runner")


async def _is(value: Any, expected: str) -> bool:
    return bool(await value == expected)


async def _pool(kube: KubeClient, driver: str, unique: str) -> str:
    """A one-device pool of ``driver`` on the runner's node, and a class for it."""
    device = {"name": "dev-0", "attributes": {"model": {"string": "test"}}}
    await kube.create(f"{RESOURCE}/resourceslices", device_slice(f"{unique}-slice", driver, NODE, [device], slices=1))
    klass = f"{unique}.test"
    await kube.create(f"{RESOURCE}/deviceclasses", device_class(klass, driver))
    return klass


async def _plugin(kube: KubeClient, cluster: DevCluster, driver: str, unique: str,
                  **options: Any) -> tuple[DraTestPlugin, str]:
    """A pool of ``driver`` and its class, and a test plugin the kubelet code has registered."""
    klass = await _pool(kube, driver, unique)
    plugin = DraTestPlugin(driver, cluster.node_dir(NODE), kube, **options)
    await plugin.start()
    try:
        await wait_for(lambda: _registered(plugin), within=30, what="the kubelet plugin manager to register the plugin")
    except BaseException:
        await plugin.stop()
        raise
    return plugin, klass


async def _pod_claiming(kube: KubeClient, ns: str, klass: str, pod: str) -> None:
    await kube.create(f"{RESOURCE}/namespaces/{ns}/resourceclaimtemplates", claim_template(pod, klass))
    await kube.create(f"/api/v1/namespaces/{ns}/pods", pod_with_claim(pod, pod))


async def _event(kube: KubeClient, ns: str, pod: str, text: str, what: str, within: float = 60) -> dict[str, Any]:
    """The first Event on ``pod`` whose reason or message contains ``text``.

    Match on the message that matters, not on the reason alone: the first attempt can fail for a
    passing reason (the Node authorizer has not yet linked the freshly bound pod's claim to the
    node: "no relationship found"), and the runner retries as the kubelet does.
    """
    async def found() -> list[dict[str, Any]]:
        return [e for e in await events(kube, ns, pod) if text in e["reason"] or text in e["message"]]

    matching: list[dict[str, Any]] = await wait_for(found, within=within, what=what)
    return matching[0]


async def test_claim_of_unregistered_driver_stays_pending_with_the_kubelets_message(
    rkube: KubeClient, rns: str, unique: str,
) -> None:
    driver = f"{unique}.absent.gpuslice.dev"
    await _pod_claiming(rkube, rns, await _pool(rkube, driver, unique), "waits")
    event = await _event(rkube, rns, "waits", f"DRA driver {driver} is not registered", "the kubelet's event")
    assert event["reason"] == "FailedPrepareDynamicResources"
    assert await phase(rkube, rns, "waits") == "Pending"
    await rkube.delete(f"/api/v1/namespaces/{rns}/pods/waits", gracePeriodSeconds=0)


async def test_registered_plugin_is_called_and_cdi_env_reaches_the_container(
    rkube: KubeClient, runner_cluster: DevCluster, rns: str, unique: str,
) -> None:
    plugin, klass = await _plugin(rkube, runner_cluster, f"{unique}.plugin.gpuslice.dev", unique)
    try:
        await _pod_claiming(rkube, rns, klass, "worker")
        await wait_for(lambda: _is(phase(rkube, rns, "worker"), "Running"), within=60, what="the pod to run")
        assert len(plugin.prepared) == 1

        printed = await asyncio.to_thread(subprocess.run, [
            sys.executable, "-m", "gpuslice", "dev-cluster", "exec-env", f"{rns}/worker",
            "--state-dir", str(runner_cluster.state.root)], capture_output=True, text=True)
        assert printed.returncode == 0, printed.stderr
        assert "GPUSLICE_TEST_DEVICE=dev-0" in printed.stdout.splitlines()
        assert f"GPUSLICE_TEST_CLAIM={rns}/" in printed.stdout

        await rkube.delete(f"/api/v1/namespaces/{rns}/pods/worker")
        await wait_for(lambda: gone(rkube, f"/api/v1/namespaces/{rns}/pods/worker"), within=30,
                       what="the pod to be removed after unprepare")
        assert plugin.unprepared == plugin.prepared
    finally:
        await plugin.stop()


async def test_cdi_spec_that_does_not_parse_keeps_the_pod_pending_with_the_reason(
    rkube: KubeClient, runner_cluster: DevCluster, rns: str, unique: str,
) -> None:
    plugin, klass = await _plugin(rkube, runner_cluster, f"{unique}.broken.gpuslice.dev", unique, broken_cdi=True)
    try:
        await _pod_claiming(rkube, rns, klass, "broken")
        event = await _event(rkube, rns, "broken", "does not parse", "an Event saying the CDI spec does not parse")
        assert event["type"] == "Warning"
        assert await phase(rkube, rns, "broken") == "Pending"
        assert _runner(runner_cluster).running, "a bad CDI spec never crashes the runner"

        # As with containerd, one driver's broken spec fails only the containers that need it.
        good, good_class = await _plugin(rkube, runner_cluster, f"{unique}.good.gpuslice.dev", f"{unique}-good")
        try:
            await _pod_claiming(rkube, rns, good_class, "healthy")
            await wait_for(lambda: _is(phase(rkube, rns, "healthy"), "Running"), within=60,
                           what="a pod of another driver to run next to the broken spec")
            await rkube.delete(f"/api/v1/namespaces/{rns}/pods/healthy")
            await wait_for(lambda: gone(rkube, f"/api/v1/namespaces/{rns}/pods/healthy"), within=30,
                           what="the healthy pod to be unprepared and removed")
        finally:
            await good.stop()
        await rkube.delete(f"/api/v1/namespaces/{rns}/pods/broken", gracePeriodSeconds=0)
    finally:
        await plugin.stop()


async def test_plugin_that_registered_and_died_leaves_the_pod_pending_with_the_reason(
    rkube: KubeClient, runner_cluster: DevCluster, rns: str, unique: str,
) -> None:
    driver = f"{unique}.dies.gpuslice.dev"
    plugin, klass = await _plugin(rkube, runner_cluster, driver, unique)
    await plugin.stop()  # the plugin process goes away without unregistering
    await _pod_claiming(rkube, rns, klass, "orphan")
    # Two reasons are the kubelet's, depending on when the first attempt lands: the call failed on the
    # vanished socket, or the plugin manager has already seen its registration socket go.
    reasons = ("code = Unavailable", f"DRA driver {driver} is not registered")

    async def explained() -> list[dict[str, Any]]:
        return [e for e in await events(rkube, rns, "orphan") if any(r in e["message"] for r in reasons)]

    event = (await wait_for(explained, within=60, what="the kubelet's event naming the dead plugin"))[0]
    assert event["reason"] == "FailedPrepareDynamicResources"
    assert await phase(rkube, rns, "orphan") == "Pending"
    assert plugin.prepared == []
    assert _runner(runner_cluster).running
    await rkube.delete(f"/api/v1/namespaces/{rns}/pods/orphan", gracePeriodSeconds=0)


async def test_plugin_that_accepts_and_hangs_times_out_and_does_not_stall_the_node(
    rkube: KubeClient, runner_cluster: DevCluster, rns: str, unique: str,
) -> None:
    plugin, klass = await _plugin(rkube, runner_cluster, f"{unique}.hangs.gpuslice.dev", unique, hang=True)
    try:
        await _pod_claiming(rkube, rns, klass, "stuck")

        async def called() -> bool:
            return bool(plugin.hung)

        await wait_for(called, within=60, what="the runner to call the hanging plugin")
        # While that call hangs, the node keeps running other pods.
        await rkube.create(f"/api/v1/namespaces/{rns}/pods", plain_pod("bystander"))
        await wait_for(lambda: _is(phase(rkube, rns, "bystander"), "Running"), within=30,
                       what="a pod without claims to run while the plugin hangs")
        # The kubelet's DRA client gives each call 45 s; then the pod gets the reason.
        event = await _event(rkube, rns, "stuck", "DeadlineExceeded", "the kubelet's timeout event", within=90)
        assert event["reason"] == "FailedPrepareDynamicResources"
        assert await phase(rkube, rns, "stuck") == "Pending"
        assert _runner(runner_cluster).running
        for pod in ("stuck", "bystander"):
            await rkube.delete(f"/api/v1/namespaces/{rns}/pods/{pod}", gracePeriodSeconds=0)
    finally:
        await plugin.stop()


async def _registered(plugin: DraTestPlugin) -> bool:
    return True in plugin.registration


def _runner(cluster: DevCluster) -> Component:
    return next(c for c in cluster.components if c.name == f"pod-runner-{NODE}")


async def test_lease_renews_and_a_stopped_runner_makes_the_node_not_ready(
    rkube: KubeClient, runner_cluster: DevCluster,
) -> None:
    lease_path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{NODE}"
    first = (await rkube.get(lease_path))["spec"]["renewTime"]

    async def renewed() -> bool:
        return bool((await rkube.get(lease_path))["spec"]["renewTime"] != first)

    await wait_for(renewed, within=15, what="the node Lease to be renewed")

    async def ready(status: str) -> bool:
        node = await rkube.get(f"/api/v1/nodes/{NODE}")
        return any(c["type"] == "Ready" and c["status"] == status for c in node["status"]["conditions"])

    runner = _runner(runner_cluster)
    await runner.stop()
    try:
        await wait_for(lambda: ready("Unknown"), within=45, what="the node-lifecycle controller to mark the node NotReady")
    finally:
        await runner.start()
    await wait_for(lambda: ready("True"), within=30, what="the node to be Ready again with its runner back")


async def test_runner_identity_is_a_node_identity(rkube: KubeClient, runner_cluster: DevCluster, rns: str) -> None:
    await rkube.create("/api/v1/nodes", fake_gpu_node(f"{rns}-other", "l4", 1))
    await rkube.create(f"/api/v1/namespaces/{rns}/secrets", {"metadata": {"name": "private"}, "stringData": {"k": "v"}})
    node_kubeconfig: Path = runner_cluster.node_dir(NODE) / "kubeconfig"
    try:
        other = await rkube.get(f"/api/v1/nodes/{rns}-other")
        other["status"]["conditions"][0]["message"] = "hijacked"
        async with await KubeClient.from_kubeconfig(node_kubeconfig) as as_node:
            assert (await as_node.get(f"/api/v1/nodes/{NODE}"))["metadata"]["name"] == NODE
            with pytest.raises(KubeError) as status_denied:
                await as_node.replace(f"/api/v1/nodes/{rns}-other/status", other)
            assert status_denied.value.status == 403
            with pytest.raises(KubeError, match="only its own Node object"):
                await as_node.get(f"/api/v1/nodes/{rns}-other")
            with pytest.raises(KubeError) as secret_denied:
                await as_node.get(f"/api/v1/namespaces/{rns}/secrets/private")
            assert secret_denied.value.status == 403
            assert "no relationship found between node" in secret_denied.value.message
    finally:
        await rkube.delete(f"/api/v1/nodes/{rns}-other")


async def test_runner_for_a_node_that_does_not_exist_waits_for_it(
    rkube: KubeClient, runner_cluster: DevCluster, unique: str, tmp_path: Path,
) -> None:
    from gpuslice.devcluster.pki import CertificateAuthority, kubeconfig

    name = f"ghost-{unique}"
    ca = CertificateAuthority.load(runner_cluster.state.pki)
    identity = ca.issue_client(f"system:node:{name}", ("system:nodes",))
    config = tmp_path / "kubeconfig"
    config.write_text(kubeconfig(runner_cluster.server, ca.pair, identity, f"system:node:{name}", "dev"))
    found = await binaries.resolve(build_if_missing=False)
    assert found.pod_runner is not None
    runner = Component("ghost-runner", [str(found.pod_runner), f"--kubeconfig={config}", f"--node={name}",
                                        f"--root={tmp_path / 'root'}"], tmp_path / "runner.log")
    await runner.start()
    try:
        async def says_it_waits() -> bool:
            return "waiting for the Node object" in (tmp_path / "runner.log").read_text()

        await wait_for(says_it_waits, within=30, what="the runner to log that it waits for its Node")
        assert runner.running, "a missing Node never crashes the runner"
        await rkube.create("/api/v1/nodes", fake_gpu_node(name, "l4", 1))
        lease = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{name}"
        await wait_for(lambda: _exists(rkube, lease), within=30, what="the runner to take the node once it exists")
    finally:
        await runner.stop()
        await rkube.delete(f"/api/v1/nodes/{name}")


async def _exists(kube: KubeClient, path: str) -> bool:
    return not await gone(kube, path)
