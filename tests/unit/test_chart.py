"""The Helm chart's conventions, with the real helm (from its Go module) and no cluster: what
chart-testing's `ct lint` checks (helm lint --strict with every values file of ci/, Chart.yaml's
fields), and what each convention value renders: log level and format, every documented setting as
its variable and nothing else, extra flags and variables, pod annotations and labels, Helm's
standard labels and commonLabels on every object, ServiceAccount annotations, security contexts,
the agent's update strategy and the kubelet's root directory, and the CRDs as kept templates."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuslice.cli import DOCUMENTED
from tests.hacktools import hack_tool

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts/gpuslice"
NS = ["--namespace", "gpuslice-system"]


@pytest.fixture(scope="module")
def helm() -> str:
    return hack_tool("helm")


def render(helm: str, *args: str) -> list[dict[str, Any]]:
    done = subprocess.run([helm, "template", "gpuslice", str(CHART), *NS, *args], capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def refused(helm: str, *args: str) -> str:
    done = subprocess.run([helm, "template", "gpuslice", str(CHART), *NS, *args], capture_output=True, text=True,
                          check=False)
    assert done.returncode != 0, f"helm template {' '.join(args)} rendered"
    return done.stderr


def workload(objects: list[dict[str, Any]], name: str) -> dict[str, Any]:
    [found] = [d for d in objects if d["kind"] in ("Deployment", "DaemonSet") and d["metadata"]["name"] == name]
    return found


def container(objects: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return dict(workload(objects, name)["spec"]["template"]["spec"]["containers"][0])


def env(objects: list[dict[str, Any]], name: str) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container(objects, name).get("env", [])}


def test_what_ct_lint_checks_passes_for_every_values_file(helm: str) -> None:
    """chart-testing is not served by the Go module proxy, so this runs what its `ct lint` runs."""
    for values in [None, *sorted((CHART / "ci").glob("*-values.yaml"))]:
        args = ["-f", str(values)] if values else []
        linted = subprocess.run([helm, "lint", "--strict", *NS, str(CHART), *args], capture_output=True, text=True,
                                check=False)
        assert linted.returncode == 0, linted.stdout + linted.stderr
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert re.fullmatch(r"\d+\.\d+\.\d+(-[0-9A-Za-z.]+)?", chart["version"])
    for field in ("apiVersion", "name", "version", "appVersion", "description", "type", "kubeVersion", "home",
                  "sources", "maintainers"):
        assert chart.get(field), f"Chart.yaml has no {field}"
    annotations = chart["annotations"]
    assert annotations["artifacthub.io/license"] == "Apache-2.0"
    crds = yaml.safe_load(annotations["artifacthub.io/crds"])
    assert {c["kind"] for c in crds} == {"GpuSlicePolicy", "GpuSliceLedger", "GpuSliceAgentView"}
    ct = yaml.safe_load((REPO / "ct.yaml").read_text())
    assert ct["chart-dirs"] == ["charts"]


def test_log_level_and_format_and_every_documented_setting_become_variables(helm: str) -> None:
    objects = render(helm, "--set", "controller.logLevel=debug,agent.logFormat=json,webhook.logLevel=warning",
                     "--set", "controller.settings.statusInterval=20,controller.settings.leaderElection=false",
                     "--set", "agent.settings.mpsDaemonArgs={-a,-b}", "--set", "webhook.settings.chargeGrace=5")
    downward = {"GPUSLICE_NAMESPACE": ""}  # the pod's namespace (valueFrom)
    assert env(objects, "gpuslice-controller") == {**downward, "GPUSLICE_LOG_LEVEL": "debug",
                                                   "GPUSLICE_STATUS_INTERVAL": "20", "GPUSLICE_LEADER_ELECTION": "false"}
    assert env(objects, "gpuslice-webhook") == {**downward, "GPUSLICE_LOG_LEVEL": "warning", "GPUSLICE_CHARGE_GRACE": "5"}
    agent = env(objects, "gpuslice-agent")
    assert agent["GPUSLICE_LOG_FORMAT"] == "json"
    assert agent["GPUSLICE_MPS_DAEMON_ARGS"] == "-a -b"
    assert "NODE_NAME" in agent, "the overlay's own variables stay"
    # Every documented setting of each process is offered, but those the chart passes as flags.
    schema = yaml.safe_load((CHART / "values.schema.json").read_text())["properties"]
    for process in ("controller", "agent", "webhook"):
        model = DOCUMENTED[process]
        offered = set(schema[process]["properties"]["settings"]["properties"])
        args = " ".join(container(render(helm), f"gpuslice-{process}")["args"])
        for name in model.model_fields:
            camel = re.sub(r"_(\w)", lambda m: m.group(1).upper(), name)
            flagged = model.flag(name) in args
            assert (camel in offered) == (not flagged and name not in (
                "kubeconfig", "log_level", "log_format", "node", "namespace", "nvidia_driver_root")), f"{process}: {name}"


def test_a_setting_the_process_does_not_have_or_the_chart_sets_is_refused(helm: str) -> None:
    assert "statusIntervall" in refused(helm, "--set", "controller.settings.statusIntervall=20")
    assert "metricsPort" in refused(helm, "--set", "agent.settings.metricsPort=9000")
    assert "logLevel" in refused(helm, "--set", "controller.logLevel=verbose")


def test_extra_flags_variables_pod_metadata_and_service_account_annotations(helm: str) -> None:
    objects = render(helm, "--set", "controller.extraArgs={--drift-interval=60}",
                     "--set-json", 'agent.env=[{"name": "HTTPS_PROXY", "value": "http://proxy:3128"}]',
                     "--set-string", "webhook.podAnnotations.sidecar\\.istio\\.io/inject=false",
                     "--set", "agent.podLabels.team=gpu,commonLabels.cost-center=ml",
                     "--set", "controller.serviceAccount.annotations.iam\\.example/role=gpuslice")
    assert container(objects, "gpuslice-controller")["args"][-1] == "--drift-interval=60"
    assert env(objects, "gpuslice-agent")["HTTPS_PROXY"] == "http://proxy:3128"
    webhook = workload(objects, "gpuslice-webhook")["spec"]["template"]["metadata"]
    assert webhook["annotations"] == {"sidecar.istio.io/inject": "false"}
    agent = workload(objects, "gpuslice-agent")
    assert agent["spec"]["template"]["metadata"]["labels"]["team"] == "gpu"
    assert "team" not in agent["spec"]["selector"]["matchLabels"], "a selector never changes with values"
    [account] = [d for d in objects if d["kind"] == "ServiceAccount" and d["metadata"]["name"] == "gpuslice-controller"]
    assert account["metadata"]["annotations"] == {"iam.example/role": "gpuslice"}
    for doc in objects:
        labels = doc["metadata"]["labels"]
        assert labels["cost-center"] == "ml", f"{doc['kind']} {doc['metadata']['name']}"
        assert labels["app.kubernetes.io/instance"] == "gpuslice"
        # Its own wins: the uninstall finds most admission policies by app.kubernetes.io/managed-by=gpuslice.
        assert labels["app.kubernetes.io/managed-by"] in ("Helm", "gpuslice")
        assert labels["helm.sh/chart"] == f"gpuslice-{yaml.safe_load((CHART / 'Chart.yaml').read_text())['version']}"


def test_security_contexts_update_strategy_and_the_kubelets_root_directory(helm: str) -> None:
    objects = render(helm, "--set", "controller.podSecurityContext.runAsUser=1000680000",
                     "--set", "agent.updateStrategy.rollingUpdate.maxUnavailable=10%",
                     "--set", "kubelet.rootDir=/var/lib/k0s/kubelet")
    pod = workload(objects, "gpuslice-controller")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsUser"] == 1000680000
    agent = workload(objects, "gpuslice-agent")
    assert agent["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"] == "10%"
    text = yaml.safe_dump(agent)
    assert "/var/lib/kubelet" not in text
    mounts = {m["name"]: m["mountPath"] for m in agent["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]}
    paths = {v["name"]: v["hostPath"]["path"] for v in agent["spec"]["template"]["spec"]["volumes"] if "hostPath" in v}
    for name in ("plugins-registry", "plugin", "pod-resources"):
        assert paths[name].startswith("/var/lib/k0s/kubelet/"), paths
        assert mounts[name] == paths[name], "the kubelet dials the path the plugin reports: the same on both sides"


def test_the_crds_are_templates_that_helm_upgrades_and_uninstall_keeps(helm: str) -> None:
    crds = [d for d in render(helm) if d["kind"] == "CustomResourceDefinition"]
    assert {d["metadata"]["name"] for d in crds} == {"gpuslicepolicies.gpuslice.dev", "gpusliceledgers.gpuslice.dev",
                                                     "gpusliceagentviews.gpuslice.dev"}
    for crd in crds:
        assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert not (CHART / "crds").exists(), "crds/ is never upgraded by Helm: the CRDs are templates"


def test_helm_test_runs_a_pod_of_the_release_image_with_a_read_only_account(helm: str) -> None:
    hooks = [d for d in render(helm, "--set", "image.digest=sha256:" + "0" * 64)
             if d["metadata"].get("annotations", {}).get("helm.sh/hook") == "test"]
    [pod] = [d for d in hooks if d["kind"] == "Pod"]
    assert pod["spec"]["containers"][0]["image"].endswith("@sha256:" + "0" * 64), "the release's image, by digest"
    [role] = [d for d in hooks if d["kind"] == "Role"]
    assert role["rules"] == [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                              "resourceNames": ["gpuslice-controller"], "verbs": ["get"]}]
    compile(pod["spec"]["containers"][0]["args"][0], "helm test", "exec")


ALL_ON = ["--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.prometheusRule.enabled=true",
          "--set", "metrics.dashboard.enabled=true", "--set", "networkPolicy.enabled=true",
          "--set", "webhook.certManager.enabled=true", "--set", "webhook.clientAuth.caConfigMap=kube-root-ca.crt"]


def rendered_in(helm: str, namespace: str, *args: str) -> str:
    done = subprocess.run([helm, "template", "gpuslice", str(CHART), "--namespace", namespace, *ALL_ON, *args],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def where_named(objects: list[dict[str, Any]], namespace: str) -> dict[str, list[str]]:
    """Where gpuslice's own namespace is written: each namespaced object's metadata, the RBAC subjects,
    the identities in the admission rules, the CRD's rules that refuse it as a tenant, the webhook's Service."""
    found: dict[str, list[str]] = {"objects": [], "subjects": [], "identities": [], "tenant rules": [],
                                   "webhook service": []}
    for doc in objects:
        meta = doc["metadata"]
        if meta.get("namespace") == namespace:
            found["objects"].append(f"{doc['kind']}/{meta['name']}")
        found["subjects"] += [s["name"] for s in doc.get("subjects") or [] if s.get("namespace") == namespace]
        text = yaml.safe_dump(doc.get("spec") or {})
        found["identities"] += re.findall(rf"system:serviceaccount:{namespace}:[a-z-]+", text)
        if doc["kind"] == "CustomResourceDefinition":
            found["tenant rules"] += re.findall(rf"self != '{namespace}'|!\('{namespace}' in self.namespaces\)", text)
        for hook in doc.get("webhooks") or []:
            if (hook["clientConfig"].get("service") or {}).get("namespace") == namespace:
                found["webhook service"].append(hook["name"])
    return {where: [item.replace(namespace, "<namespace>") for item in items] for where, items in found.items()}


def test_the_chart_installs_into_any_namespace_and_names_no_other(helm: str) -> None:
    """helm install -n team-gpu: every namespaced object there, and the namespace the RBAC subjects, the
    service-account identities in the CEL rules, the CRD's rules that refuse gpuslice's own namespace as a
    tenant and the webhook's Service name is that one; gpuslice-system is nowhere, the hook and the test
    pod included. Each workload learns it from its pod (GPUSLICE_NAMESPACE, the Downward API)."""
    text = rendered_in(helm, "team-gpu")
    assert "gpuslice-system" not in text, [line for line in text.splitlines() if "gpuslice-system" in line]
    objects = [d for d in yaml.safe_load_all(text) if d]
    default = where_named([d for d in yaml.safe_load_all(rendered_in(helm, "gpuslice-system")) if d],
                          "gpuslice-system")
    assert where_named(objects, "team-gpu") == default, "the other namespace is named where the default is"
    assert all(default.values()), default  # each kind of place is there to be templated
    assert "system:serviceaccount:<namespace>:gpuslice-controller" in default["identities"]
    for name in ("gpuslice-controller", "gpuslice-agent", "gpuslice-webhook"):
        [variable] = [e for e in container(objects, name)["env"] if e["name"] == "GPUSLICE_NAMESPACE"]
        assert variable["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}


def test_namespace_override_wins_over_the_release_namespace_and_must_be_a_namespace_name(helm: str) -> None:
    objects = [d for d in yaml.safe_load_all(rendered_in(helm, "team-x", "--set", "namespaceOverride=gpu-ops")) if d]
    namespaced = {d["metadata"].get("namespace") for d in objects if "namespace" in d["metadata"]}
    assert namespaced == {"gpu-ops", "default"}  # default: the Roles to post Events about nodes there
    assert "namespaceOverride" in refused(helm, "--set", "namespaceOverride=Not_A_Namespace")
