"""A review is a request body, and without client authentication anyone who reaches the webhook's
port can send one: only the claim as the API server holds it is charged, and a review never lowers
a charge. A tenant with maxMemory 20Gi holding c0 and c1 (10Gi each), with c2 waiting, tries what
the second December review did and more: a ghost claim, a review saying c0 consumed 0, another
namespace's claim, a pool that does not exist named over and over."""

from __future__ import annotations

from typing import Any

from gpuslice.api.ledger import ledger_path
from gpuslice.dra.names import CONTROLLER_NAMESPACE
from gpuslice.kube.client import KubeClient
from gpuslice.webhook.ledger import Ledgers
from gpuslice.webhook.review import Reviewer
from gpuslice.webhook.state import SLICES, State
from tests import builders
from tests.fakeapi import FakeApi

GI = 2**30
POLICY, TENANT, OTHER, NODE = "p", "team-a", "team-b", "node-1"
KLASS = f"{POLICY}.gpuslice.dev"
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims"


def claim(name: str, namespace: str = TENANT, device: str | None = None, consumed: str | None = None,
          asked: str | None = None) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": KLASS}
    if asked is not None:
        exactly["capacity"] = {"requests": {"memory": asked}}
    body: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{namespace}-{name}"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}}
    if device is not None:
        body["status"] = {"allocation": allocation(device, consumed)}
    return body


def allocation(device: str, consumed: str | None = None, pool: str = NODE) -> dict[str, Any]:
    result: dict[str, Any] = {"request": "gpu", "driver": "gpu.gpuslice.dev", "pool": pool, "device": device}
    if consumed is not None:
        result["consumedCapacity"] = {"memory": consumed}
    return {"devices": {"results": [result]}}


def review(obj: dict[str, Any], namespace: str | None = None, **fields: Any) -> dict[str, Any]:
    """An UPDATE of resourceclaims/status as the API server sends it (or as a forger writes it)."""
    namespace = namespace or obj["metadata"]["namespace"]
    return {"uid": "r-1", "operation": "UPDATE", "namespace": namespace, "name": obj["metadata"]["name"],
            "subResource": "status", "object": obj, "oldObject": {**obj, "status": {}}, **fields}


def allocated(name: str, device: str, consumed: str | None = None, asked: str | None = None) -> dict[str, Any]:
    """The review of the scheduler's write of ``name``'s allocation."""
    return review(claim(name, device=device, consumed=consumed, asked=asked))


async def setup(api: FakeApi, kube: KubeClient, held_claims: int = 2) -> Reviewer:
    """maxMemory 20Gi; c0 and c1 allocated (and charged 10Gi each, or only the first
    ``held_claims``); c2 waiting; a shared device too."""
    policy = builders.policy(POLICY, {"mode": "memory", "sliceSize": "10Gi"}, generation=1, uid=f"u-{POLICY}",
                             node=builders.NODE, tenants=(), judged=True)
    policy["spec"]["tenants"] = [{"namespace": TENANT, "maxMemory": "20Gi"}, {"namespace": OTHER}]
    held = [claim(f"c{i}", device=f"s-{i}") for i in range(2)]
    api.put(*held, claim("c2"), claim("w", asked="15Gi"), claim("victim", namespace=OTHER))
    ledger = {"apiVersion": "gpuslice.dev/v1alpha1", "kind": "GpuSliceLedger",
              "metadata": {"name": f"{POLICY}.{TENANT}", "namespace": "gpuslice-system"},
              "spec": {"policy": POLICY, "namespace": TENANT, "namespaceUid": "ns-uid", "maxMemory": "20Gi",
                       "limitBytes": 20 * GI},
              "status": {"since": "2026-12-06T10:00:00Z", "namespaceUid": "ns-uid", "heldBytes": 20 * GI,
                         "charges": [{"claim": c["metadata"]["name"], "uid": c["metadata"]["uid"], "bytes": 10 * GI,
                                      "at": "2026-12-06T10:00:00Z"} for c in held[:held_claims]]}}
    api.put(ledger, path=ledger_path(POLICY, TENANT, CONTROLLER_NAMESPACE))
    state = State(kube)
    state.policies.handle(None, policy)
    state.ledgers.handle(None, api.get(ledger_path(POLICY, TENANT, CONTROLLER_NAMESPACE)) or {})
    ours = {"gpuslice.dev/policy": {"string": POLICY}}
    devices = [{"name": f"s-{i}", "attributes": ours, "capacity": {"memory": {"value": "10Gi"}}} for i in range(4)]
    devices.append({"name": "shared", "attributes": ours, "capacity": {"memory": {"value": "80Gi", "requestPolicy": {
        "default": "5Gi", "validRange": {"min": "5Gi", "step": "5Gi"}}}}})
    state.slices.handle(None, {"metadata": {"name": "node-1-slice"}, "spec": {
        "driver": "gpu.gpuslice.dev", "pool": {"name": NODE}, "nodeName": NODE, "devices": devices}})
    return Reviewer(Ledgers(state))


def charges(api: FakeApi) -> dict[str, int]:
    status = (api.get(ledger_path(POLICY, TENANT, CONTROLLER_NAMESPACE)) or {}).get("status") or {}
    return {c["claim"]: c["bytes"] for c in status.get("charges") or []}


async def test_a_review_of_a_claim_that_is_not_there_charges_nothing_and_says_nothing_of_the_ledger(
        api: FakeApi, kube: KubeClient) -> None:
    reviewer = await setup(api, kube)
    ghost = claim("ghost", device="s-2")
    answer = await reviewer.review(review(ghost))
    assert not answer.allowed
    assert "ResourceClaim team-a/ghost does not exist" in answer.message
    assert "maxMemory" not in answer.message, answer.message
    assert "holds" not in answer.message, answer.message
    made_again = claim("c2", device="s-2")
    made_again["metadata"]["uid"] = "another"
    assert "another UID" in (await reviewer.review(review(made_again))).message
    other_spec = claim("c2", device="s-2", asked="1Gi")
    assert "is not the claim's" in (await reviewer.review(review(other_spec))).message
    assert charges(api) == {"c0": 10 * GI, "c1": 10 * GI}
    assert not api.writes()


async def test_a_review_never_lowers_a_charge(api: FakeApi, kube: KubeClient) -> None:
    """The review's W2: c0 said to have consumed 0 (of a shared device), or a smaller device: refused
    as not how c0 is allocated; and c0's own allocation sent again keeps its charge."""
    reviewer = await setup(api, kube)
    for said in (claim("c0", device="shared", consumed="0"), claim("c0", device="s-0", consumed="0")):
        answer = await reviewer.review(review(said))
        assert not answer.allowed
        assert "allocated already, and not as the review says" in answer.message
    assert (await reviewer.review(allocated("c0", "s-0"))).allowed, "the same write seen again"
    assert charges(api) == {"c0": 10 * GI, "c1": 10 * GI}
    refused = await reviewer.review(allocated("c2", "s-2"))
    assert not refused.allowed
    assert "holds 20Gi of its 20Gi maxMemory" in refused.message


async def test_a_review_of_another_namespaces_claim_charges_nothing(api: FakeApi, kube: KubeClient) -> None:
    """team-a has 10Gi left; a review in team-a's name of team-b's claim (its name, UID and spec are
    readable with gpuslice-viewer) is not charged there."""
    reviewer = await setup(api, kube, held_claims=1)
    victim = claim("victim", namespace=OTHER, device="s-3")
    for forged in (review(victim, namespace=TENANT), review({**victim, "metadata": {
            **victim["metadata"], "namespace": TENANT}}, name="c2")):
        answer = await reviewer.review(forged)
        assert not answer.allowed, forged
    assert charges(api) == {"c0": 10 * GI}
    assert not api.writes()


async def test_a_shared_result_is_charged_no_more_than_its_request_rounds_up_to(api: FakeApi,
                                                                             kube: KubeClient) -> None:
    """Claim w asks 15Gi of a device whose step is 5Gi: 15Gi is what the scheduler consumes; a review
    saying 60Gi (to block the tenant's other claims) is refused, and so is one beyond the device."""
    reviewer = await setup(api, kube)
    for consumed in ("60Gi", "100Gi", "lots"):
        answer = await reviewer.review(allocated("w", "shared", consumed=consumed, asked="15Gi"))
        assert not answer.allowed, consumed
        assert "result gpu consumed" in answer.message or "is not a Kubernetes quantity" in answer.message
    refused = await reviewer.review(allocated("w", "shared", consumed="15Gi", asked="15Gi"))
    assert "this claim asks 15Gi" in refused.message, "judged, at the size the scheduler would give it"


async def test_a_zero_charge_is_never_written(api: FakeApi, kube: KubeClient) -> None:
    reviewer = await setup(api, kube)
    api.put(claim("z", asked="1Gi"))
    assert (await reviewer.review(allocated("z", "shared", consumed="0", asked="1Gi"))).allowed
    assert "z" not in charges(api)
    assert not api.writes()


async def test_an_unknown_pool_is_read_once_however_often_it_is_named(api: FakeApi, kube: KubeClient) -> None:
    reviewer = await setup(api, kube)
    before = len(api.requests)
    for _ in range(5):
        forged = claim("c2", device="x")
        forged["status"] = {"allocation": allocation("x", pool="nowhere")}
        answer = await reviewer.review(review(forged))
        assert "is not published" in answer.message
    lists = [r for r in api.requests[before:] if r.method == "GET" and r.path == SLICES]
    assert len(lists) == 1


async def test_the_watchs_copy_of_the_very_version_written_spares_the_read_and_no_other_does(
        api: FakeApi, kube: KubeClient) -> None:
    """The API server's review is of a write against one version of the claim (its oldObject); when
    the watch holds that very version, it is the claim as the API server holds it (the write fails
    if the claim changed since), and no read is needed. Any other version is read again."""
    reviewer = await setup(api, kube, held_claims=1)
    path = f"{CLAIMS.format(ns=TENANT)}/c2"
    waiting = api.get(path) or {}
    reviewer.state.claims.handle(None, waiting)
    before = len(api.requests)
    written = review(claim("c2", device="s-2"))
    written["oldObject"] = waiting
    assert (await reviewer.review(written)).allowed
    assert not [r for r in api.requests[before:] if r.method == "GET" and r.path == path]
    assert charges(api) == {"c0": 10 * GI, "c2": 10 * GI}
    api.put(claim("c2", device="s-3"))  # allocated since, elsewhere; the watch has not brought it yet
    stale = review(claim("c2", device="s-2"))
    stale["oldObject"] = {**waiting, "metadata": {**waiting["metadata"], "resourceVersion": "1"}}
    answer = await reviewer.review(stale)
    assert "allocated already, and not as the review says" in answer.message
    assert [r for r in api.requests[before:] if r.method == "GET" and r.path == path]


async def test_a_copy_of_a_waiting_claim_is_charged_no_more_than_it_asks(api: FakeApi, kube: KubeClient) -> None:
    """The third review's W: team-a holds only c0 (10Gi of 20Gi); its waiting claim c2, copied as it
    is (name, UID, spec), reviewed with two results for its one request, or on the shared device
    without saying what it consumed (the whole 80Gi): refused, nothing charged. The allocation the
    scheduler would write is admitted."""
    reviewer = await setup(api, kube, held_claims=1)
    api.remove(f"{CLAIMS.format(ns=TENANT)}/c1")
    twice = claim("c2", device="s-2")
    twice["status"]["allocation"]["devices"]["results"] *= 2
    whole = claim("c2", device="shared")
    for forged, said in ((twice, "asks for 1 device(s), and the review gives it 2"),
                         (whole, "does not say what it consumed")):
        answer = await reviewer.review(review(forged))
        assert not answer.allowed
        assert said in answer.message
    assert charges(api) == {"c0": 10 * GI}
    assert (await reviewer.review(allocated("c2", "s-2"))).allowed
    assert charges(api) == {"c0": 10 * GI, "c2": 10 * GI}
