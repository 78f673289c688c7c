"""Each pod's GPU use as Prometheus series, from the last usage pass.

The per-pod series are built at scrape time from the last pass's snapshot, so a pod's series exist
exactly while it runs on the node holding gpuslice devices, and go with it: their number is
bounded by the pods holding devices on the node (at most one per device it publishes) times the
GPUs each holds devices on. Per tenant, per GPU and per outcome series are bounded by the
policies, their tenants and the node's GPUs.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client import REGISTRY, Counter
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpuslice.planning.node.gpu_use import NodeUse, PodGpuUse, tenant_totals

POD_LABELS = ["node", "namespace", "pod", "container", "policy", "gpu"]
USAGE_PASSES = Counter("gpuslice_agent_usage_passes_total", "Passes that measured each pod's GPU use: ok, or failed"
                       " (the kubelet's PodResources API or the GPUs could not be read; the log says why).",
                       ["outcome"])


@dataclass
class UseSnapshot:
    node: str
    use: NodeUse = field(default_factory=lambda: NodeUse((), {}))
    overusing: frozenset[tuple[str, str]] = frozenset()  # (pod, GPU UUID)
    gpus: tuple[str, ...] = ()


class UseMetrics(Collector):
    """Serves the snapshot the collector last took (replaced whole: a scrape sees one pass)."""

    def __init__(self) -> None:
        self.snapshot = UseSnapshot("")

    def collect(self) -> Iterator[Metric]:
        snapshot = self.snapshot
        node = snapshot.node
        used = GaugeMetricFamily("gpuslice_pod_gpu_memory_used_bytes", "GPU memory the pod's processes use on the"
                                 " GPU (NVML, per process, charged to the pod through its cgroup).", labels=POD_LABELS)
        allocated = GaugeMetricFamily("gpuslice_pod_gpu_memory_allocated_bytes", "GPU memory the pod's claims were"
                                      " allocated on the GPU (its slices, or its shares of a shared device); a claim"
                                      " several pods share is split evenly among them, so the sum over pods is"
                                      " what was allocated.", labels=POD_LABELS)
        busy = GaugeMetricFamily("gpuslice_pod_gpu_utilization_ratio", "Share of the GPU's SMs the pod's processes"
                                 " kept busy over the last pass (0 to 1; 0 where the GPU reports no samples).",
                                 labels=POD_LABELS)
        overuse = GaugeMetricFamily("gpuslice_pod_gpu_overuse", "1 while the pod's claim on the GPU is over its"
                                    " allocation: its pods (every pod that shares it) use more than it holds,"
                                    " beyond the tolerance, for the grace.", labels=POD_LABELS)
        for use in snapshot.use.pods:
            labels = _labels(node, use)
            used.add_metric(labels, use.used)
            allocated.add_metric(labels, use.allocated)
            busy.add_metric(labels, use.sm)
            if (str(use.pod), use.gpu) in snapshot.overusing:
                overuse.add_metric(labels, 1)
        tenant_used = GaugeMetricFamily("gpuslice_tenant_used_bytes", "GPU memory the tenant's pods use on this node,"
                                        " by the policy of their devices (sum by policy and namespace over the"
                                        " nodes: the tenant's use, next to gpuslice_tenant_allocated_bytes and"
                                        " gpuslice_tenant_limit_bytes).", labels=["node", "policy", "namespace"])
        for (policy, namespace), (total, _) in sorted(tenant_totals(snapshot.use.pods).items()):
            tenant_used.add_metric([node, policy, namespace], total)
        stray = GaugeMetricFamily("gpuslice_gpu_unattributed_memory_used_bytes", "GPU memory of processes no pod"
                                  " with a gpuslice device on the GPU accounts for (an admin-access container,"
                                  " another driver's, the MPS server).", labels=["node", "gpu"])
        for gpu in snapshot.gpus:
            stray.add_metric([node, gpu], snapshot.use.unattributed.get(gpu, 0))
        yield from (used, allocated, busy, overuse, tenant_used, stray)

    def describe(self) -> Iterator[Metric]:
        return iter(())  # the families are dynamic; registering must not collect


def _labels(node: str, use: PodGpuUse) -> list[str]:
    return [node, use.pod.namespace, use.pod.name, use.container, use.policy, use.gpu]


USE = UseMetrics()
REGISTRY.register(USE)
