"""What `kubectl apply -k` installs, checked against the real apiserver without installing it:
every object of the base and of each overlay passes a server-side dry-run (schema, defaulting,
admission), install.yaml is the nvidia overlay as rendered now, the controller's pod meets
the `restricted` Pod Security Standard while the agent's (host paths, root, the host's PID
namespace) does not, not even `baseline`."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from gpuslice.kube.client import KubeClient, KubeError
from tests.cluster.install.render import REPO, path_of, refused_by_dry_run, render
from tests.cluster.kubeutil import create_namespace, delete_namespace

KUSTOMIZATIONS = ["manifests/base", "manifests/overlays/kind", "manifests/overlays/nvidia"]


def pod_template(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    return next(d for d in objects if d["kind"] == kind and name in (None, d["metadata"]["name"]))["spec"]["template"]


def test_install_yaml_is_the_nvidia_overlay_as_rendered_now(kustomize: str) -> None:
    checked = subprocess.run([sys.executable, str(REPO / "hack/manifests.py"), "--check", "--kustomize", kustomize],
                             capture_output=True, text=True, check=False)
    assert checked.returncode == 0, checked.stderr


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
async def test_every_object_passes_a_server_side_dry_run(kube: KubeClient, kustomize: str, kustomization: str) -> None:
    objects = render(kustomize, kustomization)
    kinds = {d["kind"] for d in objects}
    assert {"Namespace", "CustomResourceDefinition", "Deployment", "DaemonSet", "ServiceAccount", "ClusterRole",
            "ClusterRoleBinding", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
            "ValidatingWebhookConfiguration", "Service", "PodDisruptionBudget"} <= kinds
    # Namespaced objects are judged in their namespace, so that one is created for real first.
    for namespace in (d for d in objects if d["kind"] == "Namespace"):
        await kube.apply(path_of(namespace), namespace, field_manager="gpuslice-install-check")
    failures = await refused_by_dry_run(kube, objects)
    assert not failures, f"{kustomization}: the apiserver refused:\n" + "\n".join(failures)


async def test_the_controller_pod_meets_restricted_and_the_agent_pod_does_not(kube: KubeClient, kustomize: str,
                                                                               unique: str) -> None:
    objects = render(kustomize, "manifests/overlays/kind")
    namespace = await create_namespace(kube, f"restricted-{unique}",
                                       {"pod-security.kubernetes.io/enforce": "restricted"})
    try:
        async def admit(template: dict[str, Any], name: str) -> None:
            # The ServiceAccounts live in gpuslice-system; Pod Security does not look at them.
            spec = {**template["spec"], "serviceAccountName": "default"}
            await kube.request("POST", f"/api/v1/namespaces/{namespace}/pods",
                               {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec},
                               query={"dryRun": "All"})

        await admit(pod_template(objects, "Deployment", "gpuslice-controller"), "controller")
        await admit(pod_template(objects, "Deployment", "gpuslice-webhook"), "webhook")
        with pytest.raises(KubeError) as refused:
            await admit(pod_template(objects, "DaemonSet"), "agent")
        assert refused.value.status == 403, refused.value
        assert "restricted" in str(refused.value), refused.value
    finally:
        await delete_namespace(kube, namespace)


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
async def test_the_agent_runs_in_the_nodes_pid_namespace_and_can_tell_when_it_does_not(
        kube: KubeClient, kustomize: str, unique: str, kustomization: str) -> None:
    """NVML lists a GPU's processes in the caller's PID namespace: without hostPID the agent sees no pod's.
    --host-proc is the node's /proc by hostPath (not the container's own /proc, which would always match
    it), so the agent's start-up check can tell. Pod Security's baseline refuses hostPID: the agent's
    namespace must be privileged."""
    template = pod_template(render(kustomize, kustomization), "DaemonSet")
    assert template["spec"]["hostPID"] is True
    [agent] = template["spec"]["containers"]
    [host_proc] = [a.split("=", 1)[1] for a in agent["args"] if a.startswith("--host-proc=")]
    [mount] = [m for m in agent["volumeMounts"] if m["mountPath"] == host_proc]
    [volume] = [v for v in template["spec"]["volumes"] if v["name"] == mount["name"]]
    assert volume["hostPath"]["path"] == "/proc"
    assert host_proc != "/proc"
    namespace = await create_namespace(kube, f"baseline-{unique}", {"pod-security.kubernetes.io/enforce": "baseline"})
    try:
        # Pod Security is judged here; the dev cluster has no RuntimeClass nvidia to admit it into.
        spec = {**template["spec"], "serviceAccountName": "default", "runtimeClassName": None}
        with pytest.raises(KubeError) as refused:
            await kube.request("POST", f"/api/v1/namespaces/{namespace}/pods",
                               {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "agent"}, "spec": spec},
                               query={"dryRun": "All"})
        assert refused.value.status == 403, refused.value
        assert "host namespaces (hostPID=true)" in str(refused.value), refused.value
    finally:
        await delete_namespace(kube, namespace)
