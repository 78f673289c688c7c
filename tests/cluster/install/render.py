"""The install as `kubectl apply -k` would apply it: kustomize's rendering, each object's REST path,
and a server-side dry run of it."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

from gpuslice.kube.client import KubeClient, KubeError

REPO = Path(__file__).resolve().parents[3]


def render(kustomize: str, path: str) -> list[dict[str, Any]]:
    built = subprocess.run([kustomize, "build", path], cwd=REPO, capture_output=True, text=True, check=False)
    assert built.returncode == 0, f"kustomize build {path} failed:\n{built.stderr}"
    return [d for d in yaml.safe_load_all(built.stdout) if d]


def path_of(doc: dict[str, Any]) -> str:
    """The object's REST path, for any kind an install renders (the plural as the API spells it)."""
    meta, kind = doc["metadata"], doc["kind"].lower()
    plural = kind[:-1] + "ies" if kind.endswith("y") else kind + "s"
    prefix = "/api/v1" if doc["apiVersion"] == "v1" else f"/apis/{doc['apiVersion']}"
    namespace = f"/namespaces/{meta['namespace']}" if meta.get("namespace") else ""
    return f"{prefix}{namespace}/{plural}/{meta['name']}"


async def refused_by_dry_run(kube: KubeClient, objects: list[dict[str, Any]]) -> list[str]:
    """Each object server-side applied as a dry run; what the apiserver refused, and why."""
    failures = []
    for doc in objects:
        if doc["kind"] in JUDGED_AS_NEW:
            doc = {**doc, "metadata": {**doc["metadata"], "name": doc["metadata"]["name"] + "-install-check"}}
        try:
            await kube.request("PATCH", path_of(doc), doc, content_type="application/apply-patch+yaml",
                               query={"fieldManager": "gpuslice-install-check", "force": True, "dryRun": "All"})
        except KubeError as error:
            failures.append(f"{doc['kind']} {doc['metadata']['name']}: {error}")
    return failures


# Installed differently on the dev cluster, whose webhook the API server calls by URL on loopback:
# applied over that one, the install's service would sit beside its url (a refusal of the merge,
# not of the object), so these are judged as a new object of another name.
JUDGED_AS_NEW = {"ValidatingWebhookConfiguration"}
