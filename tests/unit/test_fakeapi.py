"""The fake API server keeps the semantics the fast tests rely on, as kube-apiserver does: if it
drifted, a table test could pass against it and the code still fail on a cluster."""

from __future__ import annotations

import pytest

from gpuslice.kube.client import AlreadyExists, BadRequest, Conflict, Forbidden, KubeClient, NotFound, ServerError
from gpuslice.kube.watch import list_all
from tests.fakeapi import FakeApi, Refusal, Request

CMS = "/api/v1/namespaces/ns/configmaps"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"


def cm(name: str, **labels: str) -> dict[str, object]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "ns", "labels": labels},
            "data": {"k": name}}


async def test_writes_bump_the_resource_version_and_a_stale_one_is_a_conflict(api: FakeApi, kube: KubeClient) -> None:
    made = await kube.create(CMS, cm("a"))
    changed = await kube.merge_patch(f"{CMS}/a", {"data": {"k": "b"}})
    assert int(changed["metadata"]["resourceVersion"]) > int(made["metadata"]["resourceVersion"])
    assert changed["metadata"]["uid"] == made["metadata"]["uid"]
    with pytest.raises(Conflict):
        await kube.replace(f"{CMS}/a", {**cm("a"), "metadata": {**made["metadata"]}})
    with pytest.raises(AlreadyExists):
        await kube.create(CMS, cm("a"))
    with pytest.raises(NotFound):
        await kube.get(f"{CMS}/b")


async def test_apply_creates_or_replaces_and_a_dry_run_stores_nothing(api: FakeApi, kube: KubeClient) -> None:
    await kube.apply(f"{CMS}/a", cm("a", x="1"), field_manager="m", dry_run=True)
    assert api.get(f"{CMS}/a") is None
    await kube.apply(f"{CMS}/a", cm("a", x="1"), field_manager="m")
    await kube.apply(f"{CMS}/a", {**cm("a"), "data": {}}, field_manager="m")
    stored = api.get(f"{CMS}/a")
    assert stored is not None
    assert stored["data"] == {}
    assert stored["metadata"]["labels"] == {}, "the applier owns the whole object: what it no longer sends goes"
    assert [str(r) for r in api.writes()] == [f"PATCH {CMS}/a?fieldManager=m&force=true"] * 2


async def test_selectors_and_pages_are_served_and_unknown_field_labels_refused(api: FakeApi, kube: KubeClient) -> None:
    api.put(*(cm(f"c{i}", tier="a" if i % 2 else "b") for i in range(5)))
    assert [o["metadata"]["name"] for o in await kube.list(CMS, labelSelector="tier=a")] == ["c1", "c3"]
    assert len(await kube.list(CMS, labelSelector="tier in (a,b),!gone")) == 5
    assert len(await kube.list(CMS, labelSelector="tier!=a")) == 3
    assert [o["metadata"]["name"] for o in await kube.list(CMS, fieldSelector="metadata.name=c4")] == ["c4"]
    items, version = await list_all(kube, "/api/v1/configmaps", page=2)
    assert len(items) == 5
    assert version
    assert len([r for r in api.requests if r.path == "/api/v1/configmaps"]) == 3, "three pages of two"
    with pytest.raises(BadRequest, match="field label not supported"):
        await kube.list(SLICES, fieldSelector="spec.devices=x")


async def test_faults_come_on_cue_and_admission_judges_dry_runs_too(api: FakeApi, kube: KubeClient) -> None:
    api.fail("GET", f"{CMS}/a", 503, times=5)
    with pytest.raises(ServerError):
        await kube.get(f"{CMS}/a")

    def no_b(request: Request, obj: dict[str, object] | None) -> Refusal | None:
        return Refusal(403, "no b here") if obj and obj["metadata"]["name"] == "b" else None  # type: ignore[index]

    api.admit(no_b)
    with pytest.raises(Forbidden, match="no b here"):
        await kube.create(CMS, cm("b"), dryRun="All")
    await kube.create(CMS, cm("c"), dryRun="All")
    assert api.items(CMS) == []


async def test_a_namespace_is_an_object_not_a_namespace_of_objects(api: FakeApi, kube: KubeClient) -> None:
    api.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ns"}, "status": {"phase": "Active"}})
    await kube.merge_patch("/api/v1/namespaces/ns", {"metadata": {"labels": {"a": "b"}}, "status": {"phase": "x"}})
    stored = api.get("/api/v1/namespaces/ns")
    assert stored is not None
    assert stored["metadata"]["labels"] == {"a": "b"}
    assert stored["status"] == {"phase": "Active"}, "status is a subresource: the main resource leaves it alone"
