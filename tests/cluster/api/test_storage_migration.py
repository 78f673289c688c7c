"""docs/install.md, "CRDs": the plan from v1alpha1 to the next version, step by step on the real
apiserver, with the real GpuSlicePolicy schema and the example policies, under a group of its own
(so no other test's CRD moves): v1beta1 served beside v1alpha1; storage moved to v1beta1 and every
object rewritten, as the storage version migrator does; v1alpha1 dropped from status.storedVersions;
then v1alpha1 no longer served. No object is lost or changed, and the step the plan forbids to skip
(dropping a version objects may still be stored in) is refused by the apiserver itself."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuslice.kube.client import KubeClient, KubeError, NotFound
from tests.cluster.kubeutil import wait_for

REPO = Path(__file__).resolve().parents[3]
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


def version(crd: dict[str, Any], name: str, *, served: bool, storage: bool) -> dict[str, Any]:
    [alpha] = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
    return {**copy.deepcopy(alpha), "name": name, "served": served, "storage": storage}


async def put_crd(kube: KubeClient, crd: dict[str, Any]) -> None:
    current = await kube.get(f"{CRDS}/{crd['metadata']['name']}")
    await kube.replace(f"{CRDS}/{crd['metadata']['name']}",
                       {**crd, "metadata": {**crd["metadata"], "resourceVersion": current["metadata"]["resourceVersion"]}})


async def serving(kube: KubeClient, group: str, name: str) -> None:
    async def served() -> bool:
        try:
            listing = await kube.get(f"/apis/{group}/{name}")
        except NotFound:
            return False
        return any(r["name"] == "gpuslicepolicies" for r in listing.get("resources", []))

    await wait_for(served, within=60, what=f"{group}/{name} to be served")


async def test_the_plan_to_the_next_version_moves_every_object_and_loses_none(kube: KubeClient, unique: str) -> None:
    group = f"migration-{unique}.gpuslice.dev"
    crd: dict[str, Any] = yaml.safe_load((REPO / "crds/gpuslicepolicies.gpuslice.dev.yaml").read_text())
    crd["metadata"] = {"name": f"gpuslicepolicies.{group}"}
    crd["spec"]["group"] = group
    await kube.create(CRDS, crd)
    try:
        await serving(kube, group, "v1alpha1")
        examples = [yaml.safe_load(p.read_text()) for p in sorted((REPO / "examples/policies").glob("*.yaml"))]
        assert len(examples) >= 3
        for policy in examples:
            await kube.create(f"/apis/{group}/v1alpha1/gpuslicepolicies", {**policy, "apiVersion": f"{group}/v1alpha1"})
        specs = {p["metadata"]["name"]: p["spec"] for p in await kube.list(f"/apis/{group}/v1alpha1/gpuslicepolicies")}
        # 1. v1beta1 served beside v1alpha1, which stays the storage version (a conversion of None:
        #    the same schema; docs/install.md says when a webhook takes over).
        crd = await kube.get(f"{CRDS}/{crd['metadata']['name']}")
        crd["spec"]["versions"] = [version(crd, "v1alpha1", served=True, storage=True),
                                   version(crd, "v1beta1", served=True, storage=False)]
        await put_crd(kube, crd)
        await serving(kube, group, "v1beta1")
        # 2. Storage moves to v1beta1; every object is read and written unchanged, so it is stored anew.
        crd = await kube.get(f"{CRDS}/{crd['metadata']['name']}")
        crd["spec"]["versions"] = [version(crd, "v1alpha1", served=True, storage=False),
                                   version(crd, "v1beta1", served=True, storage=True)]
        await put_crd(kube, crd)
        stored = (await kube.get(f"{CRDS}/{crd['metadata']['name']}"))["status"]["storedVersions"]
        assert stored == ["v1alpha1", "v1beta1"]
        # Skipping the rewrite: the apiserver refuses to drop a version objects may be stored in.
        skipped = await kube.get(f"{CRDS}/{crd['metadata']['name']}")
        skipped["spec"]["versions"] = [version(skipped, "v1beta1", served=True, storage=True)]
        with pytest.raises(KubeError, match="storedVersions"):
            await put_crd(kube, skipped)
        for item in await kube.list(f"/apis/{group}/v1beta1/gpuslicepolicies"):
            await kube.replace(f"/apis/{group}/v1beta1/gpuslicepolicies/{item['metadata']['name']}", item)
        crd = await kube.get(f"{CRDS}/{crd['metadata']['name']}")
        crd["status"]["storedVersions"] = ["v1beta1"]
        await kube.replace(f"{CRDS}/{crd['metadata']['name']}/status", crd)
        # 3. v1alpha1 no longer served; every object reads as it was written.
        crd = await kube.get(f"{CRDS}/{crd['metadata']['name']}")
        crd["spec"]["versions"] = [version(crd, "v1alpha1", served=False, storage=False),
                                   version(crd, "v1beta1", served=True, storage=True)]
        await put_crd(kube, crd)

        async def alpha_gone() -> bool:
            try:
                await kube.get(f"/apis/{group}/v1alpha1")
            except NotFound:
                return True
            return False

        await wait_for(alpha_gone, within=60, what="v1alpha1 to be served no more")
        moved = {p["metadata"]["name"]: p["spec"] for p in await kube.list(f"/apis/{group}/v1beta1/gpuslicepolicies")}
        assert moved == specs, "an object was lost or changed on the way"
        final = await kube.get(f"{CRDS}/{crd['metadata']['name']}")
        assert final["status"]["storedVersions"] == ["v1beta1"]
    finally:
        await kube.delete(f"{CRDS}/gpuslicepolicies.{group}")
