"""``gpuslice plan --cluster -f POLICY``: the agents' answer to an edit, before it is applied.

Reads the live policies, pools and claims, puts the edited policy in place of the live
one (or next to them, for a new one) and runs the planner and the safety layer for
each node (``planning.reads.policy_change``). A node's GPUs are those its published devices
stand on; a fake-GPU node's labels name them all, so on kind and the dev cluster a
GPU that publishes nothing yet is previewed too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from gpuslice.agent.gpus.fake import FakeBackend, parse_fake_gpus
from gpuslice.api.resource import GpuSlicePolicy, ParseProblem, parse_policy
from gpuslice.dra.names import CONTROLLER_NAMESPACE
from gpuslice.inspect.snapshot import InspectError, read_snapshot
from gpuslice.inventory.gpus import Gpu
from gpuslice.inventory.nodes import FAKE_BACKEND, FAKE_COUNT, FAKE_MODEL, FAKE_SYSTEM
from gpuslice.inventory.systems import SYSTEMS
from gpuslice.kube.client import KubeClient
from gpuslice.planning.reads.policy_change import ChangePlan, plan_change

NEWEST = "9999-12-31T23:59:59Z"  # a policy not created yet is younger than every live one


def load_edits(paths: list[Path]) -> list[dict[str, Any]]:
    documents = []
    for path in paths:
        try:
            loaded = [d for d in yaml.safe_load_all(path.read_text()) if d]
        except (OSError, yaml.YAMLError) as error:
            raise InspectError(f"{path}: {error}") from None
        for document in loaded:
            if document.get("kind") != "GpuSlicePolicy" or not (document.get("metadata") or {}).get("name"):
                raise InspectError(f"{path}: expected a GpuSlicePolicy with metadata.name, found"
                                   f" {document.get('kind')!r}")
            documents.append(document)
    return documents


def edited(document: dict[str, Any], live: dict[str, Any] | None) -> GpuSlicePolicy:
    """The file's spec with the live object's identity, age and status (seniority reads them)."""
    meta = dict(live["metadata"]) if live else {"creationTimestamp": NEWEST}
    meta["name"] = document["metadata"]["name"]
    meta["generation"] = int(meta.get("generation") or 0) + 1
    body = {"metadata": meta, "spec": document.get("spec") or {}, "status": (live or {}).get("status") or {}}
    parsed = parse_policy(body)
    if isinstance(parsed, ParseProblem):
        raise InspectError(f"GpuSlicePolicy {meta['name']} is invalid: {parsed.fields(5)} (the apiserver would"
                           " refuse it)")
    return parsed


def fake_gpus(nodes: Iterable[Mapping[str, Any]]) -> dict[str, list[Gpu]]:
    found = {}
    for node in nodes:
        labels = node["metadata"].get("labels") or {}
        if labels.get(FAKE_BACKEND) == "fake" and labels.get(FAKE_SYSTEM) in SYSTEMS:  # a whole server, its layout
            name = str(node["metadata"]["name"])
            found[name] = FakeBackend(name, parse_fake_gpus(labels[FAKE_SYSTEM])).discover()
        elif labels.get(FAKE_BACKEND) == "fake" and labels.get(FAKE_MODEL):
            try:
                count = int(labels.get(FAKE_COUNT, "1"))
            except ValueError:
                continue
            name = str(node["metadata"]["name"])
            try:
                found[name] = FakeBackend(name, [(labels[FAKE_MODEL], count)]).discover()
            except KeyError:
                continue  # a model the catalog does not know: use what the node publishes
    return found


async def plan_from_cluster(kube: KubeClient, paths: list[Path], home: str = CONTROLLER_NAMESPACE) -> list[ChangePlan]:
    documents = load_edits(paths)
    snapshot = await read_snapshot(kube, home)
    live = {str(b["metadata"]["name"]): dict(b) for b in snapshot.policies}
    pools = snapshot.pools()
    gpus = fake_gpus(snapshot.nodes)
    plans = []
    policies = list(snapshot.policies)
    for document in documents:
        name = str(document["metadata"]["name"])
        policy = edited(document, live.get(name))
        plans.append(plan_change(policy, policies, pools, snapshot.nodes, gpus))
    return plans
