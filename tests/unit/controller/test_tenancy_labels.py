"""The tenancy label goes on exactly the namespaces some policy names and the controller's own,
and the controller waits for its CRD instead of exiting (what each does against a real API server:
tests/cluster/install/test_scoped_admission.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, cast

import pytest

from gpuslice.controller import crd as crd_module
from gpuslice.controller.admin_access import NamespaceView
from gpuslice.controller.crd import CRD_NAME, CRD_PATH, CrdState, crd_leaving, crd_state, until_crd_leaves, wait_for_crd
from gpuslice.controller.tenancy_labels import named_namespaces, plan_tenancy_labels
from gpuslice.kube.client import Forbidden, KubeClient, NotFound, ServerError
from tests.builders import policy


def naming(tenants: list[str], admins: list[str] = (), deleting: bool = False) -> dict[str, Any]:  # type: ignore[assignment]
    """A policy that names ``tenants`` and admin namespaces ``admins``, perhaps being deleted."""
    return policy("p", tenants=tenants, adminAccess={"namespaces": list(admins)},
                  deleting="2026-12-02T00:00:00Z" if deleting else None)


def _ns(judged: bool, active: bool = True) -> NamespaceView:
    labels = {"gpuslice.dev/tenancy": "judged"} if judged else {}
    return NamespaceView(labels, active, "uid")


def test_the_namespaces_policies_name_and_the_controllers_own_are_wanted() -> None:
    wanted = named_namespaces([naming(["a", "b"], ["ops"]), naming(["c"]), {"metadata": {}, "spec": {}}], "own")
    assert wanted == {"own", "a", "b", "c", "ops"}


def test_a_policy_being_deleted_names_no_namespace() -> None:
    assert named_namespaces([naming(["a"], deleting=True), naming(["b"])], "own") == {"own", "b"}


def test_labels_follow_what_is_wanted_and_terminating_namespaces_are_left_alone() -> None:
    namespaces = {"a": _ns(False), "b": _ns(True), "stale": _ns(True), "other": _ns(False),
                  "going": _ns(True, active=False), "coming": _ns(False, active=False)}
    label, unlabel = plan_tenancy_labels(namespaces, {"a", "b", "coming", "missing"})
    assert (label, unlabel) == (["a"], ["stale"])


class _Server:
    """Answers what the controller asks about its CRD (the CRD object, and discovery) from a script."""

    def __init__(self, *answers: Any, discovery: Any = None, policies: int = 0) -> None:
        self.answers = list(answers)
        self.discovery = discovery
        self.policies = [{"metadata": {"name": f"p{i}"}} for i in range(policies)]
        self.asked = 0

    async def get(self, path: str, **_: Any) -> dict[str, Any]:
        if path == "/apis/gpuslice.dev/v1alpha1/gpuslicepolicies":
            return {"items": self.policies}
        if path == "/apis/gpuslice.dev/v1alpha1":
            answer = self.discovery
        else:
            assert path == CRD_PATH
            self.asked += 1
            answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return cast(dict[str, Any], answer)


MISSING = NotFound(404, "NotFound", "not found", None)
BUSY = ServerError(503, "ServiceUnavailable", "busy", None)
ESTABLISHED = {"metadata": {}, "status": {"conditions": [{"type": "Established", "status": "True"}]}}
DELETING = {"metadata": {"deletionTimestamp": "2026-12-02T00:00:00Z"}, "status": ESTABLISHED["status"]}
SERVED = {"resources": [{"name": "gpuslicepolicies"}, {"name": "gpuslicepolicies/status"}]}


async def test_the_crd_is_served_once_established_and_not_while_it_is_deleted() -> None:
    assert await crd_state(cast(KubeClient, _Server(ESTABLISHED))) is CrdState.SERVED
    assert await crd_state(cast(KubeClient, _Server(DELETING))) is CrdState.LEAVING
    assert await crd_state(cast(KubeClient, _Server({"metadata": {}}))) is CrdState.MISSING  # not established
    assert await crd_state(cast(KubeClient, _Server(MISSING))) is CrdState.MISSING


async def test_without_the_permission_to_read_the_crd_discovery_answers() -> None:
    forbidden = Forbidden(403, "Forbidden", "forbidden", None)
    assert await crd_state(cast(KubeClient, _Server(forbidden, discovery=SERVED))) is CrdState.SERVED
    assert await crd_state(cast(KubeClient, _Server(forbidden, discovery=MISSING))) is CrdState.MISSING


async def test_the_controller_waits_for_its_crd_and_clears_labels_meanwhile() -> None:
    server = _Server(MISSING, BUSY, DELETING, ESTABLISHED)
    cleared: list[int] = []

    async def clear() -> None:
        cleared.append(server.asked)

    served = await wait_for_crd(cast(KubeClient, server), asyncio.Event(), clear, first=0.01, cap=0.02)
    assert served
    assert server.asked == 4
    assert cleared == [1, 3]  # each time it was found missing or leaving; a failed question is no answer


async def test_waiting_for_the_crd_ends_when_the_controller_stops() -> None:
    stop = asyncio.Event()

    async def clear() -> None:
        stop.set()

    assert not await asyncio.wait_for(wait_for_crd(cast(KubeClient, _Server(MISSING)), stop, clear, first=5), 2)


async def test_a_failed_question_is_no_answer() -> None:
    with pytest.raises(ServerError):
        await crd_state(cast(KubeClient, _Server(BUSY)))


async def test_kopf_stops_once_a_crd_being_deleted_has_no_policy_left() -> None:
    """Before the API server removes it (within seconds of the last policy going): Kopf's watch must
    not see it go."""
    assert not await crd_leaving(cast(KubeClient, _Server(ESTABLISHED)))
    assert not await crd_leaving(cast(KubeClient, _Server(DELETING, policies=1)))  # still finalizing them
    assert await crd_leaving(cast(KubeClient, _Server(DELETING, policies=0)))
    assert await crd_leaving(cast(KubeClient, _Server(MISSING)))


# While its CRD stays served the controller asks nothing about it: a watch of that one CRD tells it
# when the CRD is deleted (it checked 5.5 times a minute before). It asks only while the CRD is
# being deleted with policies left, or where its RBAC grants no watch (an older install): then
# every interval, as before. The watch is scripted; what is under test is when the controller asks.


class ScriptedWatch:
    """Stands for gpuslice.kube.watch.watch: hands the listing, then the events a test sends."""

    def __init__(self, listing: list[dict[str, Any]], error: BaseException | None = None) -> None:
        self.listing, self.error = listing, error
        self.events: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue()
        self.query: dict[str, Any] = {}

    async def __call__(self, kube: Any, path: str, handler: Callable[..., Any], stop: asyncio.Event, *,
                       query: dict[str, Any], on_error: Callable[[BaseException], None],
                       on_listed: Callable[[], None]) -> None:
        self.query = query
        if self.error is not None:
            on_error(self.error)
            await stop.wait()
            return
        for item in self.listing:
            handler(None, item)
        on_listed()
        while not stop.is_set():
            kind, body = await self.events.get()
            handler(kind, body)


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def test_a_served_crd_costs_no_request_and_its_deletion_is_told_by_the_watch(
        monkeypatch: pytest.MonkeyPatch) -> None:
    scripted = ScriptedWatch([ESTABLISHED])
    monkeypatch.setattr(crd_module, "watch", scripted)
    server, leaving = _Server(ESTABLISHED, policies=1), asyncio.Event()
    task = asyncio.create_task(until_crd_leaves(cast(KubeClient, server), leaving, interval=0.05))
    await asyncio.sleep(0.3)  # six intervals: the old check asked six times
    assert server.asked == 0
    assert scripted.query == {"fieldSelector": f"metadata.name={CRD_NAME}"}
    server.answers = [DELETING]
    scripted.events.put_nowait(("MODIFIED", DELETING))  # deleted, its policies still finalizing
    await settle()
    assert server.asked == 1
    assert not leaving.is_set()
    server.policies = []  # the last one went (its handler's answer was lost): asked again in an interval
    await asyncio.wait_for(leaving.wait(), 2)
    await task


async def test_a_crd_gone_while_the_watch_was_down_is_seen_in_the_next_listing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(crd_module, "watch", ScriptedWatch([]))
    leaving = asyncio.Event()
    await asyncio.wait_for(until_crd_leaves(cast(KubeClient, _Server(MISSING)), leaving, interval=60), 2)
    assert leaving.is_set()


async def test_without_the_right_to_watch_it_the_controller_asks_every_interval(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(crd_module, "watch", ScriptedWatch([], Forbidden(403, "Forbidden", "forbidden", None)))
    server, leaving = _Server(ESTABLISHED), asyncio.Event()
    task = asyncio.create_task(until_crd_leaves(cast(KubeClient, server), leaving, interval=0.05))
    await asyncio.sleep(0.4)
    assert server.asked >= 3
    assert not leaving.is_set()
    server.answers = [MISSING]
    await asyncio.wait_for(leaving.wait(), 2)
    await task


def test_a_namespace_the_watch_shows_older_than_the_controllers_own_label_is_taken_as_labelled() -> None:
    """A fleet's policies converging at once each saw the namespaces as its handler first did, and
    labelled every tenant namespace again (200 writes for 20 namespaces): what the controller wrote
    stands until the watch shows the namespace at that version or later."""
    stale = NamespaceView({}, True, "uid", version=10)
    written = {("a", "gpuslice.dev/tenancy"): ("judged", 12), ("b", "gpuslice.dev/tenancy"): (None, 12)}
    namespaces = {"a": stale, "b": NamespaceView({"gpuslice.dev/tenancy": "judged"}, True, "uid", version=11)}
    assert plan_tenancy_labels(namespaces, {"a"}, written=written) == ([], [])
    # Someone took the label off after the controller's write: the watch shows it, and it goes back.
    later = {"a": NamespaceView({}, True, "uid", version=13), "b": namespaces["b"]}
    assert plan_tenancy_labels(later, {"a"}, written=written) == (["a"], [])
    assert plan_tenancy_labels(namespaces, {"a"}) == (["a"], ["b"])  # without the record, as before


class _Namespaces:
    """The API server's side of routing labels: merge patches of namespaces, each a new resourceVersion."""

    def __init__(self) -> None:
        self.version, self.labels, self.patches = 1, {}, []  # type: ignore[var-annotated]

    async def merge_patch(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        name = path.rsplit("/", 1)[1]
        self.version += 1
        self.patches.append(name)
        for key, value in body["metadata"]["labels"].items():
            self.labels.setdefault(name, {})[key] = value
        return {"metadata": {"name": name, "resourceVersion": str(self.version)}}


async def test_a_converge_that_began_before_a_policy_was_created_leaves_that_policys_tenants_labelled() -> None:
    """Fifty policies created at once: each converge's handler began with the policies the watch held
    then, and one that began before a policy was created took the label off that policy's tenants
    (their claims refused meanwhile) after its own converge had put it on; each namespace was written
    up to 11 times. What is unlabelled is judged by the policies the watch holds under the lock."""
    from gpuslice.controller.tenancy_labels import sync_routes

    server, lock, written = _Namespaces(), asyncio.Lock(), {}  # type: ignore[var-annotated]
    kube = cast(KubeClient, server)
    early = {"p": naming(["a"])}
    watch = dict(early)  # the watch's index: it gains the new policy while the first handler waits
    began_before = dict(early)  # what the first handler's World copied when it began
    seen = {"own": _ns(True), "a": _ns(False), "late": _ns(False)}
    late = policy("q", tenants=["late"])
    watch["q"] = late
    await sync_routes(kube, lock, seen, lambda: watch.values(), "own", written)  # q's own converge
    assert server.labels["late"]["gpuslice.dev/tenancy"] == "judged"
    patches = len(server.patches)
    await sync_routes(kube, lock, seen, lambda: watch.values(), "own", written)  # p's, begun before q existed
    assert server.labels["late"]["gpuslice.dev/tenancy"] == "judged"
    assert len(server.patches) == patches, "nothing to write: the labels are as every policy wants them"
    # The copy the handler began with would have taken it off: what the fix is about.
    await sync_routes(kube, lock, seen, lambda: began_before.values(), "own", written)
    assert server.labels["late"]["gpuslice.dev/tenancy"] is None


def test_a_world_asks_the_watch_for_the_policies_when_asked_not_when_made() -> None:
    from gpuslice.controller.indexes import OWNED, world

    index: dict[str, list[dict[str, Any]]] = {"p": [naming(["a"])]}
    empty: dict[Any, Any] = {}
    kwargs = {"policy_index": index, "namespace_index": empty, "node_index": empty, "slice_index": empty,
              "claim_index": empty, "class_index": empty, "quota_index": empty, "ledger_index": empty,
              "policy_pool_index": empty, "parsed_index": empty, "other_driver_index": empty,
              **dict.fromkeys(OWNED, empty)}
    made = world(kwargs)
    index["q"] = [policy("q", tenants=["late"])]
    assert set(made.policies) == {"p"}
    assert set(made.policies_now()) == {"p", "q"}
