"""Hostile review, December (third round), W: a review of a real waiting claim, its name, UID and
spec copied as they are, charges no more than the claim could be allocated.

docs/install.md ("Managed control planes") says what still holds where the webhook cannot ask its
caller for a certificate: a caller that reads a tenant's claims "can have one of its waiting claims
charged at its own size before the scheduler allocates it". The check behind that
(planning.claim_review) compares the review's claim with the stored one (exists, UID, spec, not
allocated otherwise) and bounds what each shared result consumed by what its request rounds up to.
It does not bound how many results there are, nor which device a result names: an allocation of
one 1Gi request with thirty results of 1Gi each (or one result on the largest device published) is
charged thirty times the claim's size, to the victim, renewably while the claim waits. The victim
(maxMemory 30Gi, holding nothing) is then refused its next 1Gi claim.

The forger is the test process on loopback, with no certificate, at a second webhook that asks for
none (as on EKS, GKE, AKS). The webhook the API server calls, with the client certificate check
on, turns the same forger away in the handshake (test_forged_reviews.py covers that).

A promise test: it asserts the charge stays at the claim's size and the victim's claim is allocated,
so it fails while the hole is open.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gpuslice.devcluster.cluster import DevCluster
from gpuslice.devcluster.pki import CertificateAuthority
from gpuslice.kube.client import KubeClient, KubeError
from tests.cluster.claims import allocation
from tests.cluster.gpu_nodes import GpuNodeFactory
from tests.cluster.kubeutil import RESOURCE, wait_for
from tests.cluster.operator_fixtures import (
    WEBHOOK_ENV,
    WEBHOOK_RBAC,
    ControllerProcess,
    PolicyFactory,
    WebhookProcess,
    write_controller_kubeconfig,
)
from tests.cluster.webhook.budgets import GI, budget_policy, claim_with_pod, ledger, memory_claim, refused_at_allocation
from tests.cluster.webhook.forgery import Forger, review_of


@pytest.fixture(scope="module")
async def open_webhook(cluster: DevCluster, kube: KubeClient, controller: ControllerProcess,
                       tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[WebhookProcess]:
    """A copy of the webhook that asks no caller for a certificate (a managed control plane's)."""
    directory = tmp_path_factory.mktemp("open-webhook")
    kubeconfig = await write_controller_kubeconfig(cluster, kube, directory, "gpuslice-webhook",
                                                 WEBHOOK_RBAC.read_text())
    process = WebhookProcess(kubeconfig, directory / "webhook.log", WEBHOOK_ENV)
    process.start()
    await process.ready(90)
    yield process
    await process.stop()


def _charges(status: dict[str, Any]) -> dict[str, int]:
    return {c["claim"]: c["bytes"] for c in status.get("charges") or []}


async def test_a_review_of_a_waiting_claim_charges_it_no_more_than_it_asks(
    cluster: DevCluster, kube: KubeClient, controller: ControllerProcess, memory_webhook: WebhookProcess,
    open_webhook: WebhookProcess, make_policy: PolicyFactory, gpu_node: GpuNodeFactory, namespace: str,
    tmp_path: Path,
) -> None:
    name, klass, devices = await budget_policy(kube, make_policy, gpu_node, namespace,
                                               {"mode": "shared", "sliceSize": "1Gi"})
    [device] = devices
    slices = await kube.list(f"{RESOURCE}/resourceslices")
    pool = next(s["spec"]["pool"]["name"] for s in slices
                for d in s["spec"].get("devices") or [] if d["name"] == device)
    # The victim's claim, made ahead of its pod (or waiting for one): readable with gpuslice-viewer.
    waiting = await kube.create(f"{RESOURCE}/namespaces/{namespace}/resourceclaims", memory_claim("waiting", klass, 1))
    forged = review_of(waiting, "1Gi", (pool, device))
    results = forged["request"]["object"]["status"]["allocation"]["devices"]["results"]
    forged["request"]["object"]["status"]["allocation"]["devices"]["results"] = [copy.deepcopy(results[0])
                                                                                for _ in range(30)]
    forger = Forger(open_webhook.port, None, tmp_path)
    answer = await forger.post(forged)
    print("W forged review of the victim's waiting 1Gi claim, 30 results of 1Gi, answered:", answer)
    # The same, with a certificate of the cluster's own CA for another name, at the webhook the API server calls.
    node_like = CertificateAuthority.load(cluster.state.pki).issue_client("system:node:rogue")
    print("W the same with a cluster-CA certificate for system:node:rogue, at the API server's webhook:",
          await Forger(memory_webhook.port, node_like, tmp_path).post(forged))
    after = (await ledger(kube, name, namespace)).get("status") or {}
    print("W victim's ledger after:", {k: v / GI for k, v in _charges(after).items()}, "Gi")

    stop = asyncio.Event()

    async def keep_forging() -> None:  # renews the charge while the claim waits
        while not stop.is_set():
            await forger.post(forged)
            await asyncio.sleep(1.0)  # length: the forger's pace, renewing the charge while the claim waits

    task = asyncio.create_task(keep_forging())
    said: str | None = None
    got = None
    try:
        await claim_with_pod(kube, namespace, "mine", memory_claim("mine", klass, 1))
        with contextlib.suppress(AssertionError):
            said = await refused_at_allocation(kube, namespace, "mine", "maxMemory")
        print("W the victim's 1Gi pod was told:", said)
        with contextlib.suppress(AssertionError):
            got = await wait_for(lambda: allocation(kube, namespace, "mine"), within=30, what="mine to be allocated")
        held = (await ledger(kube, name, namespace)).get("status") or {}
        print("W victim's ledger while forging:", {k: v / GI for k, v in _charges(held).items()}, "Gi | mine allocated:",
              bool(got))
    finally:
        stop.set()
        await asyncio.gather(task, return_exceptions=True)
        with contextlib.suppress(KubeError):
            await kube.delete(f"/api/v1/namespaces/{namespace}/pods", gracePeriodSeconds=0)
    assert _charges(after).get("waiting", 0) <= 1 * GI, (
        f"a review nobody authenticated charged the victim's waiting 1Gi claim {_charges(after)['waiting'] / GI}Gi")
    assert said is None, f"the victim's 1Gi allocation was refused because of the forged charge: {said}"
    assert got is not None, "the victim's 1Gi claim was not allocated"
