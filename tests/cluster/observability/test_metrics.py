"""What the processes serve: every metric the dashboard and the alerts use, with the labels they
match on; the per-policy and per-tenant series equal to the policy's own status."""

from __future__ import annotations

from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from gpuslice.devcluster.cluster import DevCluster
from gpuslice.kube.client import KubeClient
from tests.cluster.gpu_nodes import GpuNodeFactory
from tests.cluster.kubeutil import POLICIES, wait_for
from tests.cluster.metric_names import scrape, served
from tests.cluster.operator_fixtures import ControllerProcess, PolicyFactory
from tests.cluster.pools import create_pods, published, settle
from tests.monitoring_queries import expressions, selectors

G = 10**9


def samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {tuple(sorted(s.labels.items())): s.value for f in text_string_to_metric_families(text)
            for s in f.samples if s.name == name}


async def test_every_metric_the_dashboard_and_alerts_use_is_served(
    cluster: DevCluster, kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory,
    gpu_node: GpuNodeFactory, namespace: str,
) -> None:
    node = await gpu_node("h100-80gb", 1)
    policy = await make_policy({"nodeSelector": {"matchLabels": {"kubernetes.io/hostname": node.name}},
                                "slicing": {"mode": "memory", "sliceSize": "10G"},
                                "tenants": [{"namespace": namespace, "maxSlices": 2}]})
    name = policy["metadata"]["name"]
    await published(kube, node.name, 8)
    await create_pods(kube, namespace, "gpu-slice", ["m0"])
    await settle(cluster, kube, namespace, ["m0"], 1)

    async def counted() -> str | None:
        text = await scrape(controller.metrics_port)
        held = samples(text, "gpuslice_tenant_allocated_devices").get((("namespace", namespace), ("policy", name)))
        return text if held == 1 else None

    controller_text = await wait_for(counted, within=60, what="the controller's metrics to count the allocation")
    agent_text = await scrape(node.metrics_port)
    found = served(controller_text, agent_text)
    missing, unmatched = [], []
    for where, promql in expressions():
        for metric, labels in selectors(promql):
            if metric not in found:
                missing.append(f"{where}: {metric}")
            elif found[metric] and not all(any(label in s for s in found[metric]) for label in labels):
                unmatched.append(f"{where}: {metric} has no label {sorted(labels)}")
    assert missing == [], "metrics the dashboard or the alerts use that no process serves:\n" + "\n".join(missing)
    assert unmatched == []

    # Kopf's own requests are counted with the controller's: the controller's client never watches.
    requests = {dict(k)["verb"]: v for k, v in samples(controller_text, "gpuslice_api_requests_total").items()
                if dict(k)["component"] == "controller" and dict(k)["outcome"] == "ok"}
    assert requests.get("watch", 0) >= 3, f"Kopf's watches (policies, namespaces, quotas...) are not counted: {requests}"

    # The per-tenant series are the policy's own status.
    status = (await kube.get(f"{POLICIES}/{name}"))["status"]
    [tenant] = status["tenants"]
    labels = (("namespace", namespace), ("policy", name))
    assert samples(controller_text, "gpuslice_tenant_allocated_bytes")[labels] == tenant["allocatedBytes"] == 10 * G
    assert samples(controller_text, "gpuslice_tenant_limit_bytes")[labels] == tenant["limitBytes"] == 20 * G
    assert samples(controller_text, "gpuslice_policy_devices")[(("policy", name), ("state", "published"))] == 8
    assert samples(controller_text, "gpuslice_policy_condition")[(("condition", "Ready"), ("policy", name))] == 1


async def test_the_agent_is_ready_once_it_has_published(
    kube: KubeClient, gpu_node: GpuNodeFactory,
) -> None:
    node = await gpu_node("h100-80gb", 2)

    async def answers(path: str) -> tuple[int, str]:
        async with aiohttp.ClientSession() as session, \
                session.get(f"http://127.0.0.1:{node.metrics_port}{path}") as response:
            return response.status, await response.text()

    async def ready() -> bool:
        return (await answers("/readyz"))[0] == 200

    await wait_for(ready, within=60, what="the agent's /readyz to answer 200")
    assert await answers("/healthz") == (200, "ok\n")
    text = await scrape(node.metrics_port)
    labels = (("node", node.name),)
    assert samples(text, "gpuslice_node_gpus")[labels] == 2
    assert samples(text, "gpuslice_agent_last_publish_success_timestamp_seconds")[labels] > 0
    assert [dict(k)["component"] for k in samples(text, "gpuslice_build_info")] == ["agent"]


async def test_a_deleted_policy_leaves_no_series(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, namespace: str,
) -> None:
    policy = await make_policy({"nodeSelector": {"matchLabels": {"gpuslice.dev/test-selects": "nothing"}},
                                "slicing": {"mode": "memory", "sliceSize": "10G"},
                                "tenants": [{"namespace": namespace, "maxSlices": 2}]})
    name = policy["metadata"]["name"]

    async def present(expected: bool) -> bool:
        return (f'policy="{name}"' in await scrape(controller.metrics_port)) == expected

    await wait_for(lambda: present(True), within=60, what="the policy's series")
    await kube.delete(f"{POLICIES}/{name}")
    await wait_for(lambda: present(False), within=60, what="the deleted policy's series to go")


__all__: list[Any] = []
