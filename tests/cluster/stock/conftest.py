"""A dev cluster as a user's stock cluster: gpuslice installed, three fake nodes (the examples' H100s
and two A100 nodes, one for shared notebooks and one for MIG training), each with a pod runner."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from gpuslice.devcluster.cluster import ClusterSpec, DevCluster
from gpuslice.kube.client import KubeClient
from tests.cluster.kubeutil import dev_cluster

SHAPES = (("h100-80gb", 8), ("a100-40gb", 4), ("a100-40gb", 4))


@pytest.fixture(scope="module")
async def stock(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[DevCluster]:
    spec = ClusterSpec(tmp_path_factory.mktemp("stock"), operator=True, pod_runner=True, shapes=SHAPES)
    async with dev_cluster(spec) as running:
        yield running


@pytest.fixture(scope="module")
async def stock_kube(stock: DevCluster) -> AsyncIterator[KubeClient]:
    async with await KubeClient.from_kubeconfig(stock.kubeconfig) as client:
        yield client
