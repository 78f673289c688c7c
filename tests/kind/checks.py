"""What the kind tier reads of an installed gpuslice: its pods, a tenant's claim and environment,
and what an uninstall leaves behind."""

from __future__ import annotations

import json
from typing import Any

from gpuslice import __version__
from tests.kind.kindutil import Kind

DRIVER = "gpu.gpuslice.dev"


def claim_of(kind: Kind, namespace: str, pod: str) -> dict[str, Any]:
    status = kind.json("-n", namespace, "get", "pod", pod)["status"]
    name = next(s["resourceClaimName"] for s in status["resourceClaimStatuses"] if s["name"] == "gpu")
    return kind.json("-n", namespace, "get", "resourceclaim", name)  # type: ignore[no-any-return]


def results(claim: dict[str, Any]) -> list[dict[str, Any]]:
    allocation = (claim.get("status") or {}).get("allocation") or {}
    return [r for r in allocation.get("devices", {}).get("results", []) if r["driver"] == DRIVER]


def environment(kind: Kind, namespace: str, pod: str) -> dict[str, str]:
    lines = kind.kubectl("-n", namespace, "logs", pod).splitlines()
    return dict(line.split("=", 1) for line in lines if line.startswith("GPUSLICE_") and "=" in line)


def gpuslice_pods(kind: Kind, component: str) -> list[dict[str, Any]]:
    return kind.items("pods", "-n", "gpuslice-system", "-l", f"app.kubernetes.io/component={component}")


def ready(pod: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions", []))


def restarts(pod: dict[str, Any]) -> int:
    return sum(c["restartCount"] for c in pod["status"].get("containerStatuses", []))


IMAGE = f"gpuslice:{__version__}"


def load_upgrade_image(kind: Kind) -> str:
    """This image under a new tag, loaded into every worker (a controller's replica may land on an NVML
    one): what an upgrade rolls out."""
    upgraded = f"{IMAGE}-upgrade"
    kind.run("docker", "tag", IMAGE, upgraded)
    kind.run(kind.build["kind"], "load", "docker-image", "--name", kind.cluster, "--nodes", ",".join(kind.image_nodes),
             upgraded)
    return upgraded


# Left on purpose by every uninstall (manifests/configmap-params.yaml, kubernetes/kubernetes#130887).
KEPT = ("validatingadmissionpolicies.admissionregistration.k8s.io /gpuslice-configmap-params",
        "validatingadmissionpolicybindings.admissionregistration.k8s.io /gpuslice-configmap-params")


def leftovers(kind: Kind, kept: tuple[str, ...] = KEPT) -> list[str]:
    """Anything in the cluster that is gpuslice's or names it (events aside: they expire), but what is
    ``kept``, which must be there."""
    found = []
    for resource in kind.kubectl("api-resources", "--verbs=list", "-o", "name").split():
        if resource.split(".")[0] in ("events",):
            continue
        listed = kind.run(kind.build["kubectl"], "get", resource, "-A", "-o", "json", check=False)
        try:
            items = json.loads(listed)["items"]
        except (json.JSONDecodeError, KeyError):
            continue  # a kind whose API went away with the CRD
        for item in items:
            meta = item["metadata"]
            if meta.get("namespace") == "kube-system" and meta["name"].startswith("podnet"):
                continue  # the tier's pod network
            labels = dict(meta.get("labels", {}))
            if resource == "nodes":  # the fake-GPU labels kind/cluster.yaml gives, not gpuslice
                labels = {k: v for k, v in labels.items() if k not in NODE_LABELS}
            marks = json.dumps({**labels, **meta.get("annotations", {})})
            ours = "gpuslice" in meta["name"] or "gpuslice" in marks
            published = resource.startswith("resourceslices") and item["spec"]["driver"] == DRIVER
            if ours or published:
                found.append(f"{resource} {meta.get('namespace', '')}/{meta['name']}")
    missing = [k for k in kept if k not in found]
    assert not missing, f"the uninstall deleted what it keeps: {missing}"
    return [f for f in found if f not in kept]


def nothing_left_on_the_nodes(kind: Kind) -> None:
    for node in kind.workers:
        # The kubelet's directories: no registration socket, no service socket, no CDI spec, no
        # claim checkpoint (every claim was unprepared). The agent's state directory itself stays
        # (docs/install.md, "Uninstalling"): its record of what it published and, here, the fake GPUs' state.
        assert DRIVER not in kind.node_exec(node, "ls", "/var/lib/kubelet/plugins_registry")
        assert kind.node_exec(node, "sh", "-c", "ls /var/run/cdi | grep -c gpuslice || true").strip() == "0"
        state = f"/var/lib/kubelet/plugins/{DRIVER}"
        assert "dra.sock" not in kind.node_exec(node, "ls", state)
        assert kind.node_exec(node, "sh", "-c", f"ls {state}/claims 2>/dev/null | wc -l").strip() == "0"
        # A dynamic-MIG claim's instance went with its claim (the fake GPUs keep MIG state as a GPU does).
        fake = json.loads(kind.node_exec(node, "cat", f"{state}/fake-gpus.json"))
        instances = {index: gpu["instances"] for index, gpu in fake["gpus"].items() if gpu["instances"]}
        assert instances == {}, f"{node}: MIG instances left: {instances}"
        # The last MPS client gone, its daemon was stopped and its pipe and shared memory removed.
        assert kind.node_exec(node, "sh", "-c", "ls /dev/shm/gpuslice-mps 2>/dev/null | wc -l").strip() == "0"
        assert kind.node_exec(node, "sh", "-c", f"ls {state}/mps/*/pipe 2>/dev/null | wc -l").strip() == "0"


NODE_LABELS = {f"gpuslice.dev/{k}" for k in ("gpu-backend", "fake-gpu-model", "fake-gpu-count", "pool")}
