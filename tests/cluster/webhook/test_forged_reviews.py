"""Only the API server may have an allocation charged, and a review charges only the claim as the
API server holds it: the maxMemory webhook writes ledgers, so a review anyone could send would be
a way around every limit.

Before the second December review the webhook served TLS without asking who called and charged
what the review's body said. One POST with no credential charged another tenant 30Gi for a claim
it never had, and that tenant's real 1Gi allocation was refused; reviews saying a tenant's own
claims consumed 0 let a tenant with maxMemory 20Gi hold 30Gi. Now the dev cluster's API server
presents a client certificate (--admission-control-config-file) and the webhook it calls admits
no other caller; and, for a webhook that cannot ask (a managed control plane's API server presents
none), a second webhook without client authentication serves the same ledgers here, where every
review is checked against the claim it names and a charge is never lowered. The forger is the test
process, on loopback, where the dev cluster's API server calls the webhooks."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gpuslice.devcluster.cluster import DevCluster
from gpuslice.kube.client import KubeClient, KubeError
from tests.cluster.claims import allocation, claim, request
from tests.cluster.gpu_nodes import GpuNodeFactory
from tests.cluster.kubeutil import RESOURCE, on, wait_for
from tests.cluster.operator_fixtures import (
    WEBHOOK_ENV,
    WEBHOOK_RBAC,
    ControllerProcess,
    PolicyFactory,
    WebhookProcess,
    write_controller_kubeconfig,
)
from tests.cluster.pools import published
from tests.cluster.webhook.budgets import (
    GI,
    admits,
    budget_policy,
    claim_with_pod,
    ledger,
    memory_claim,
    memory_in_force,
    refused_at_allocation,
)
from tests.cluster.webhook.forgery import (
    Forger,
    admin_certificate,
    api_server_certificate,
    forged_review,
    look_alike_certificate,
    review_of,
)

MEMORY_10 = {"mode": "memory", "sliceSize": "10Gi"}


@pytest.fixture(scope="module")
async def open_webhook(cluster: DevCluster, kube: KubeClient, controller: ControllerProcess,
                       tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[WebhookProcess]:
    """A second copy of the webhook that asks no caller for a certificate, as one must run where the
    API server cannot present one (EKS, GKE, AKS): the same ledgers, the API server never calls it."""
    directory = tmp_path_factory.mktemp("open-webhook")
    kubeconfig = await write_controller_kubeconfig(cluster, kube, directory, "gpuslice-webhook",
                                                 WEBHOOK_RBAC.read_text())
    process = WebhookProcess(kubeconfig, directory / "webhook.log", WEBHOOK_ENV)
    process.start()
    await process.ready(90)
    yield process
    await process.stop()


def charges(status: dict[str, Any]) -> dict[str, int]:
    return {c["claim"]: c["bytes"] for c in status.get("charges") or []}


async def test_no_one_but_the_api_server_can_charge_another_tenants_ledger(
    cluster: DevCluster, kube: KubeClient, controller: ControllerProcess, memory_webhook: WebhookProcess,
    open_webhook: WebhookProcess, make_policy: PolicyFactory, gpu_node: GpuNodeFactory, namespace: str,
    tmp_path: Path,
) -> None:
    """docs/memory-limits.md: only the API server's reviews are charged, and only for the claim as it
    holds it. A review charging the victim for a claim 'ghost' that does not exist is sent with no
    certificate, with the cluster admin's (of the very CA the webhook trusts), and with the API
    server's name from the forger's own CA, to the webhook the API server calls; and with none to the
    one that asks for none. Then four forgers keep at it while the victim's real 1Gi claim is
    allocated."""
    name, klass, _ = await budget_policy(kube, make_policy, gpu_node, namespace, {"mode": "shared", "sliceSize": "1Gi"})
    before = (await ledger(kube, name, namespace)).get("status") or {}
    forgers = {
        "no certificate": Forger(memory_webhook.port, None, tmp_path),
        "the cluster admin's certificate": Forger(memory_webhook.port, admin_certificate(cluster), tmp_path),
        "the API server's name from another CA": Forger(memory_webhook.port, look_alike_certificate(), tmp_path),
        "no certificate, to a webhook that asks for none": Forger(open_webhook.port, None, tmp_path),
    }

    def ghost() -> dict[str, Any]:
        return forged_review(namespace, "ghost", str(uuid.uuid4()), klass, "30Gi")

    answers = {how: await forger.post(ghost()) for how, forger in forgers.items()}
    for how, answer in answers.items():
        print(f"a forged review with {how} was answered: {answer}")
    after = (await ledger(kube, name, namespace)).get("status") or {}
    print("victim ledger before:", before.get("charges"), "after:", after.get("charges"))
    charged = [c for c in after.get("charges") or [] if c["claim"] == "ghost"]

    stop = asyncio.Event()

    async def keep_forging(forger: Forger) -> None:
        while not stop.is_set():
            await forger.post(ghost())
            await asyncio.sleep(0.02)

    flood = [asyncio.create_task(keep_forging(f)) for f in forgers.values()]
    try:
        await claim_with_pod(kube, namespace, "mine", memory_claim("mine", klass, 1))
        said: str | None
        try:
            said = await refused_at_allocation(kube, namespace, "mine", "maxMemory")
        except AssertionError:
            said = None
        print("the victim's pod was told:", said)
        got = await wait_for(lambda: allocation(kube, namespace, "mine"), within=60, what="mine to be allocated")
    finally:
        stop.set()
        await asyncio.gather(*flood, return_exceptions=True)
        with contextlib.suppress(KubeError):
            await kube.delete(f"/api/v1/namespaces/{namespace}/pods", gracePeriodSeconds=0)
    assert not charged, f"a client that is not the API server charged {namespace}'s ledger for a claim it never had: {charged}"
    assert said is None, f"the victim's allocation was refused because of forged charges: {said}"
    assert got["devices"]["results"][0]["consumedCapacity"] == {"memory": "1Gi"}
    # How each was turned away, so that none passed by luck:
    for how in ("no certificate", "the API server's name from another CA"):
        assert isinstance(answers[how], str), f"{how}: {answers[how]}"
        assert not answers[how].startswith("HTTP"), f"{how}: refused in the TLS handshake, not after: {answers[how]}"
    assert answers["the cluster admin's certificate"] == (
        "HTTP 403: {\"message\": \"refused: a client certificate for 'gpuslice-admin', not one of"
        " --client-allowed-names; only the API server may call this webhook\"}")
    opened = answers["no certificate, to a webhook that asks for none"]
    assert isinstance(opened, dict), opened
    assert opened["allowed"] is False, opened
    assert f"ResourceClaim {namespace}/ghost does not exist" in opened["status"]["message"], opened
    assert "maxMemory" not in opened["status"]["message"], "nothing of the ledger is told"
    assert "gpuslice_webhook_callers_refused_total" in await memory_webhook.metrics()


async def test_a_tenant_holds_no_more_than_its_max_memory_whatever_it_sends_the_webhook(
    cluster: DevCluster, kube: KubeClient, controller: ControllerProcess, memory_webhook: WebhookProcess,
    open_webhook: WebhookProcess, make_policy: PolicyFactory, gpu_node: GpuNodeFactory, namespace: str,
    tmp_path: Path,
) -> None:
    """README: "A tenant never holds more than its maxMemory in force, at any committed state". A
    tenant with maxMemory 20Gi holds two 10Gi slices; its third pod is refused. It then sends reviews
    of its own two claims (their names, UIDs and specs are its own to read) saying they consumed 0:
    to the webhook that asks for no certificate, and to the one the API server calls with the API
    server's own certificate (a body replayed by whoever holds it). Neither lowers a charge, so the
    scheduler's real write of the third allocation is never admitted."""
    name, klass, _ = await budget_policy(kube, make_policy, gpu_node, namespace, MEMORY_10, max_memory="20Gi",
                                         devices=7)
    for i in range(2):
        await claim_with_pod(kube, namespace, f"c{i}", claim(f"c{i}", request(klass)))
    for i in range(2):
        await wait_for(lambda i=i: allocation(kube, namespace, f"c{i}"), within=60, what=f"c{i} to be allocated")
    await claim_with_pod(kube, namespace, "c2", claim("c2", request(klass)))
    said = await refused_at_allocation(kube, namespace, "c2", "maxMemory")
    print("before forging, c2 was told:", said)
    held_claims = {f"c{i}": await kube.get(f"{RESOURCE}/namespaces/{namespace}/resourceclaims/c{i}") for i in range(2)}
    forgers = [Forger(open_webhook.port, None, tmp_path),
               Forger(memory_webhook.port, api_server_certificate(cluster), tmp_path)]
    stop = asyncio.Event()
    answers: list[dict[str, Any] | str] = []
    lowest: dict[str, int] = {}

    async def keep_forging(forger: Forger, held: dict[str, Any]) -> None:
        while not stop.is_set():
            answers.append(await forger.post(review_of(held, "0")))
            await asyncio.sleep(0.04)

    async def watch_ledger() -> None:
        while not stop.is_set():
            for claim_name, bytes_ in charges((await ledger(kube, name, namespace)).get("status") or {}).items():
                lowest[claim_name] = min(bytes_, lowest.get(claim_name, bytes_))
            await asyncio.sleep(0.2)

    tasks = [asyncio.create_task(keep_forging(f, held)) for f in forgers for held in held_claims.values()]
    tasks.append(asyncio.create_task(watch_ledger()))
    try:
        got = None
        for _ in range(45):
            got = await allocation(kube, namespace, "c2")
            if got:
                break
            await asyncio.sleep(1)  # length: between two looks; the forgers have 45 of them to get c2 allocated
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
    held = [c["metadata"]["name"] for c in await kube.list(f"{RESOURCE}/namespaces/{namespace}/resourceclaims")
            if (c.get("status") or {}).get("allocation")]
    await asyncio.sleep(3)  # length: for a recount (its claims changed), so the ledger printed says what is held
    status = (await ledger(kube, name, namespace)).get("status") or {}
    print("allocated:", held, "| ledger heldBytes:", status.get("heldBytes"), "=", (status.get("heldBytes") or 0) / GI,
          "Gi of 20Gi | lowest charges seen:", {n: b / GI for n, b in lowest.items()}, "|", len(answers), "forged,",
          "e.g.", answers[:1] + answers[-1:])
    with contextlib.suppress(KubeError):
        await kube.delete(f"/api/v1/namespaces/{namespace}/pods", gracePeriodSeconds=0)
    assert len(held) <= 2, (f"{namespace} (maxMemory 20Gi) holds {len(held)} slices of 10Gi: {held}; ledger"
                            f" heldBytes {status.get('heldBytes')}")
    assert {n: lowest.get(n) for n in held_claims} == {n: 10 * GI for n in held_claims}, f"a charge went down: {lowest}"
    assert answers, "no review was sent"
    for answer in answers:
        assert isinstance(answer, dict), answer
        assert answer["allowed"] is False, answer
        assert "is allocated already, and not as the review says" in answer["status"]["message"], answer


async def test_a_review_of_a_real_claim_charges_it_only_in_its_namespace_and_at_its_size(
    kube: KubeClient, controller: ControllerProcess, memory_webhook: WebhookProcess, open_webhook: WebhookProcess,
    make_policy: PolicyFactory, gpu_node: GpuNodeFactory, namespace: str, namespaces: Any, tmp_path: Path,
) -> None:
    """Without client authentication, a forger that can read claims (gpuslice-viewer) copies real ones:
    its own claim reviewed in the victim's name, to fill the victim's ledger; and the victim's waiting
    claim (1Gi) reviewed as having consumed 30Gi, to keep it from its own allocations. Neither is
    charged, and the victim's 29Gi claim is allocated under its 30Gi."""
    attacker = await namespaces("atk")
    node = await gpu_node("h100-80gb", 1)
    name = (await make_policy({"nodeSelector": on(node.name), "slicing": {"mode": "shared", "sliceSize": "1Gi"},
                               "tenants": [{"namespace": namespace, "maxMemory": "30Gi"},
                                           {"namespace": attacker}]}))["metadata"]["name"]
    klass = f"{name}.gpuslice.dev"
    [device] = await published(kube, node.name, 1)
    await memory_in_force(kube, name, namespace, "30Gi")
    for ns in (namespace, attacker):
        await admits(kube, ns, klass)
    own = await kube.create(f"{RESOURCE}/namespaces/{attacker}/resourceclaims", memory_claim("own", klass, 30))
    waiting = await kube.create(f"{RESOURCE}/namespaces/{namespace}/resourceclaims", memory_claim("waiting", klass, 1))
    forger = Forger(open_webhook.port, None, tmp_path)
    in_victims_name = review_of(own, "30Gi")
    in_victims_name["request"]["namespace"] = namespace
    in_victims_name["request"]["object"]["metadata"]["namespace"] = namespace
    answers = {"the attacker's own claim, in the victim's name": await forger.post(in_victims_name),
               "the victim's waiting claim, 30 times its size": await forger.post(
                   review_of(waiting, "30Gi", (node.name, device)))}
    print(answers)
    await claim_with_pod(kube, namespace, "big", memory_claim("big", klass, 29))
    got = await wait_for(lambda: allocation(kube, namespace, "big"), within=60, what="big to be allocated")
    status = (await ledger(kube, name, namespace)).get("status") or {}
    with contextlib.suppress(KubeError):
        await kube.delete(f"/api/v1/namespaces/{namespace}/pods", gracePeriodSeconds=0)
    assert charges(status) == {"big": 29 * GI}, status
    assert got["devices"]["results"][0]["consumedCapacity"] == {"memory": "29Gi"}
    for how, answer in answers.items():
        assert isinstance(answer, dict), f"{how}: {answer}"
        assert answer["allowed"] is False, f"{how}: {answer}"
    assert "does not exist" in answers["the attacker's own claim, in the victim's name"]["status"]["message"]
    assert "more than its request can be given" in (
        answers["the victim's waiting claim, 30 times its size"]["status"]["message"])
