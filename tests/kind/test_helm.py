"""The release on kind, installed as docs/install.md tells users to, once the kustomize install is
gone (tests/kind/conftest.py runs this file after test_install.py): `make release` of this checkout
and the previous release (tests/kind/releases.py) pushed to a local OCI registry, the image signed
and verified with cosign; `helm install oci://…` of the previous release (the kind values, every
monitoring object and the NetworkPolicies on) right after the kustomize uninstall, with no API
server restart; a tenant pod prepared by the chart's agent; `helm upgrade` alone to this release
under it, the CRDs included; `helm uninstall` refused while the pod holds its slice, then done,
keeping the CRDs; installing again, still with no API server restart: a claim for a device drained
at the uninstall is admitted, and a policy edit that drains devices completes; the last uninstall
leaving nothing of gpuslice but gpuslice-configmap-params, which it keeps (the CRDs it keeps are
deleted by hand, as docs/install.md says).
"""

from __future__ import annotations

import json
import shlex
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuslice import __version__
from tests.hacktools import hack_tool
from tests.kind.checks import (
    claim_of,
    environment,
    gpuslice_pods,
    leftovers,
    nothing_left_on_the_nodes,
    ready,
    restarts,
    results,
)
from tests.kind.kindutil import REPO, TIMINGS, Kind
from tests.kind.releases import Registry, Release, make_release, previous_release, push, start_registry

RELEASE = ["gpuslice", "--namespace", "gpuslice-system"]
ON = ("metrics.serviceMonitor.enabled=true,metrics.prometheusRule.enabled=true,metrics.dashboard.enabled=true,"
      "networkPolicy.enabled=true")
CRDS = ("gpuslicepolicies.gpuslice.dev", "gpusliceledgers.gpuslice.dev", "gpusliceagentviews.gpuslice.dev")
APISERVER: dict[str, str] = {}  # the kube-apiserver's container when the kustomize install was gone


def helm(kind: Kind, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    command = [kind.build["helm"], *args]
    print(f"\n>>> {shlex.join(command)}", flush=True)
    started = time.monotonic()
    done = subprocess.run(command, env=kind.env, cwd=REPO, capture_output=True, text=True, timeout=900, check=False)
    TIMINGS[f"helm {args[0]}"] = TIMINGS.get(f"helm {args[0]}", 0) + time.monotonic() - started
    if check and done.returncode != 0:
        raise AssertionError(f"helm {args[0]} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done


def tenant_pod() -> dict[str, Any]:
    pod: dict[str, Any] = next(yaml.safe_load_all((REPO / "examples/tenants/pods.yaml").read_text()))
    assert pod["metadata"]["name"] == "inference", "examples/tenants/pods.yaml's first pod is the inference tenant"
    return pod


def apiserver_container(kind: Kind) -> str:
    node = f"{kind.cluster}-control-plane"
    [container] = kind.node_exec(node, "crictl", "ps", "-q", "--name", "^kube-apiserver$").split()
    return container


@pytest.fixture(scope="module")
def registry(deployed: Kind) -> Iterator[Registry]:
    started = time.monotonic()
    registry = start_registry(deployed)
    TIMINGS["registry"] = time.monotonic() - started
    yield registry
    deployed.run("docker", "rm", "-f", registry.container, check=False)


@pytest.fixture(scope="module")
def releases(deployed: Kind, registry: Registry, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Release]:
    """This checkout's release and the previous one, both in the registry; this one signed."""
    work = tmp_path_factory.mktemp("release")
    cosign = hack_tool("cosign")
    deployed.env["COSIGN_PASSWORD"] = ""  # a throwaway key: cosign reads its password from here
    deployed.run(cosign, "generate-key-pair", "--output-key-prefix", str(work / "cosign"))
    started = time.monotonic()
    current = make_release(deployed, registry, work / "cosign.key", work / "dist")
    TIMINGS["make release"] = time.monotonic() - started
    push(deployed, registry, current, current.dist / f"gpuslice-{__version__}.oci.tar",
         current.dist / f"gpuslice-{__version__}.tgz")
    image = f"{registry.host}/gpuslice@{current.digest}"
    # Key-based and offline: no transparency log, the signature as cosign's own OCI artifact.
    deployed.run(cosign, "sign", "--yes", "--key", str(work / "cosign.key"), "--tlog-upload=false",
                 "--use-signing-config=false", "--new-bundle-format=false", "--allow-insecure-registry", image)
    deployed.run(cosign, "verify", "--key", str(current.dist / "cosign.pub"), "--insecure-ignore-tlog",
                 "--new-bundle-format=false", "--allow-insecure-registry", image)
    other = work / "other"
    deployed.run(cosign, "generate-key-pair", "--output-key-prefix", str(other))
    refused = subprocess.run([cosign, "verify", "--key", f"{other}.pub", "--insecure-ignore-tlog",
                              "--new-bundle-format=false", "--allow-insecure-registry", image],
                             env=deployed.env, capture_output=True, text=True, timeout=300, check=False)
    assert refused.returncode != 0, "the image verified against another key"
    started = time.monotonic()
    previous = previous_release(deployed, registry)
    TIMINGS["previous release"] = time.monotonic() - started
    return {"current": current, "previous": previous}


def install(kind: Kind, registry: Registry, release: Release, *extra: str) -> None:
    """docs/install.md: the namespace (labelled), then helm install from the registry."""
    kind.kubectl("create", "namespace", "gpuslice-system")
    kind.kubectl("label", "namespace", "gpuslice-system", "pod-security.kubernetes.io/enforce=privileged",
                 "gpuslice.dev/tenancy=judged")
    helm(kind, "install", *RELEASE, f"oci://{registry.host}/charts/gpuslice", "--version", release.version,
         "--plain-http", "-f", str(release.kind_values), "--set", ON, *extra, "--wait", "--timeout", "5m")


def every_copy_ready(kind: Kind) -> None:
    # Helm's --wait takes a Deployment one copy short of its replicas (its maxUnavailable) as ready.
    def ready_all() -> bool:
        return all(ready(p) for c in ("controller", "agent", "webhook") for p in gpuslice_pods(kind, c))
    try:
        kind.wait_until("every gpuslice pod Ready", ready_all, within=300)
    except AssertionError:
        print(kind.kubectl("-n", "gpuslice-system", "get", "pods", "-o", "wide"))
        print(kind.kubectl("-n", "gpuslice-system", "describe", "pods", check=False)[-6000:])
        raise


@pytest.fixture(scope="module")
def installed(deployed: Kind, registry: Registry, releases: dict[str, Release]) -> Kind:
    # What test_install's uninstall did, again in case it stopped part way (it is idempotent). Then
    # no API server restart: gpuslice-configmap-params, which every uninstall keeps, keeps the API
    # server watching the drain lists (kubernetes/kubernetes#130887).
    deployed.make("kind-undeploy")
    APISERVER["container"] = apiserver_container(deployed)
    # docs/install.md, "From the kustomize install to the chart": the kept objects, adopted by the release.
    for kind_ in ("validatingadmissionpolicy", "validatingadmissionpolicybinding"):
        deployed.kubectl("annotate", kind_, "gpuslice-configmap-params", "meta.helm.sh/release-name=gpuslice",
                         "meta.helm.sh/release-namespace=gpuslice-system")
        deployed.kubectl("label", kind_, "gpuslice-configmap-params", "app.kubernetes.io/managed-by=Helm")
    deployed.kubectl("apply", "--server-side", "-f", deployed.build["monitoringCrds"])
    previous = releases["previous"]
    # Built by its own commit's Dockerfile and chart, without make release: its image is named here.
    install(deployed, registry, previous, "--set", f"image.repository={registry.host}/gpuslice")
    return deployed


def test_helm_install_from_the_registry_runs_gpuslice_and_a_tenant_pod_gets_its_slice(
    installed: Kind, registry: Registry, releases: dict[str, Release],
) -> None:
    kind = installed
    assert "deployed" in helm(kind, "status", *RELEASE).stdout
    every_copy_ready(kind)
    previous = f"{registry.host}/gpuslice:{releases['previous'].version}"
    assert {p["spec"]["containers"][0]["image"] for p in gpuslice_pods(kind, "controller")} == {previous}
    assert len(gpuslice_pods(kind, "agent")) == len(kind.workers)
    assert len(gpuslice_pods(kind, "webhook")) == 2
    for kind_, name in (("servicemonitor", "gpuslice-controller"), ("servicemonitor", "gpuslice-agent"),
                        ("prometheusrule", "gpuslice"), ("configmap", "gpuslice-dashboard"),
                        ("networkpolicy", "gpuslice-controller"), ("networkpolicy", "gpuslice-agent"),
                        ("servicemonitor", "gpuslice-webhook"), ("networkpolicy", "gpuslice-webhook")):
        kind.kubectl("-n", "gpuslice-system", "get", kind_, name)
    kind.kubectl("apply", "-f", "examples/tenants/namespaces.yaml", "-f", "examples/policies/inference-memory.yaml")
    kind.kubectl("wait", "gsp/inference", "--for=condition=Ready", "--timeout=300s")
    kind.kubectl("apply", "-f", "-", input=yaml.safe_dump(tenant_pod()))
    kind.kubectl("-n", "team-a", "wait", "pod/inference", "--for=condition=Ready", "--timeout=300s")
    assert environment(kind, "team-a", "inference").get("GPUSLICE_POLICY") == "inference"


def test_helm_upgrade_alone_upgrades_the_crds_and_keeps_the_running_pod_on_its_device(
    installed: Kind, registry: Registry, releases: dict[str, Release],
) -> None:
    kind = installed
    current = releases["current"]
    before = kind.json("-n", "team-a", "get", "pod", "inference")
    devices = results(claim_of(kind, "team-a", "inference"))
    assert devices, "the tenant pod holds no device"
    # The user's command: no CRD applied by hand. New values get the new chart's defaults; the
    # user's own (the kind values, the image repository) are kept.
    helm(kind, "upgrade", *RELEASE, f"oci://{registry.host}/charts/gpuslice", "--version", current.version,
         "--plain-http", "--reset-then-reuse-values", "--set", "preDelete.timeoutSeconds=20",
         "--set", "controller.logLevel=debug", "--wait", "--timeout", "5m")
    for name in CRDS:
        labels = kind.json("get", "crd", name)["metadata"]["labels"]
        assert labels.get("helm.sh/chart") == f"gpuslice-{current.version}", f"helm upgrade left {name}: {labels}"
    kind.kubectl("-n", "gpuslice-system", "rollout", "status", "daemonset/gpuslice-agent", "--timeout=300s")
    image = f"{registry.host}/gpuslice:{current.version}@{current.digest}"

    def images(component: str) -> set[str]:
        return {p["spec"]["containers"][0]["image"] for p in gpuslice_pods(kind, component)}

    for component in ("agent", "controller", "webhook"):
        kind.wait_until(f"every {component} pod to run {image}", lambda c=component: images(c) == {image}, within=180)
    now = kind.json("-n", "team-a", "get", "pod", "inference")
    assert now["metadata"]["uid"] == before["metadata"]["uid"], "the tenant pod was replaced"
    assert restarts(now) == 0
    assert ready(now)
    assert results(claim_of(kind, "team-a", "inference")) == devices, "its allocation changed"
    # `helm test`: the chart's own check, from a pod of the release's image.
    tested = helm(kind, "test", *RELEASE, "--logs", "--timeout", "3m")
    assert "leads (renewed" in tested.stdout, tested.stdout
    # controller.logLevel=debug: the controller logs debug lines.
    logs = "\n".join(kind.kubectl("-n", "gpuslice-system", "logs", p["metadata"]["name"], check=False)
                     for p in gpuslice_pods(kind, "controller"))
    levels = {json.loads(line).get("level") for line in logs.splitlines() if line.startswith("{")}
    assert "debug" in levels, f"no debug line from the controllers: levels {levels}"


def test_helm_uninstall_waits_for_claims_then_keeps_the_crds(installed: Kind) -> None:
    kind = installed
    claim = claim_of(kind, "team-a", "inference")["metadata"]["name"]
    refused = helm(kind, "uninstall", *RELEASE, "--wait", "--timeout", "3m", check=False)
    assert refused.returncode != 0, "helm uninstall went ahead while a claim held a device"
    assert "pre-delete" in refused.stderr, refused.stderr
    said = kind.kubectl("-n", "gpuslice-system", "logs", "job/gpuslice-pre-delete", check=False)
    assert claim in said, said
    assert gpuslice_pods(kind, "controller"), "the controller went before the policies"
    kind.kubectl("-n", "team-a", "delete", "pod", "inference", "--wait=true")
    helm(kind, "uninstall", *RELEASE, "--wait", "--timeout", "5m")
    for name in CRDS:
        kind.kubectl("get", "crd", name)  # kept: helm.sh/resource-policy
    for kind_ in ("validatingadmissionpolicy", "validatingadmissionpolicybinding"):
        kind.kubectl("get", kind_, "gpuslice-configmap-params")  # kept too
    assert not kind.kubectl("get", "gsp", "-o", "name"), "the pre-delete hook deleted every policy"
    kind.kubectl("delete", "namespace", "gpuslice-system", "--wait=true")


def test_install_again_needs_no_api_server_restart(
    installed: Kind, registry: Registry, releases: dict[str, Release],
) -> None:
    """kubernetes/kubernetes#130887: the claim for a device drained at the uninstall is admitted, and a
    policy edit that drains devices completes, on the API server that saw the uninstall."""
    kind = installed
    kind.wait_until("the agents' slices to be gone", lambda: not kind.kubectl(
        "get", "resourceslices", "--field-selector", "spec.driver=gpu.gpuslice.dev", "-o", "name"), within=120)
    install(kind, registry, releases["current"])
    every_copy_ready(kind)
    kind.kubectl("apply", "-f", "examples/policies/inference-memory.yaml")
    kind.kubectl("wait", "gsp/inference", "--for=condition=Ready", "--timeout=300s")
    kind.kubectl("apply", "-f", "-", input=yaml.safe_dump(tenant_pod()))
    kind.kubectl("-n", "team-a", "wait", "pod/inference", "--for=condition=Ready", "--timeout=300s")
    # An edit that changes every free device of the policy: each agent drains them first, and the
    # change is published only once the drain rule is seen to refuse them.
    kind.kubectl("patch", "gsp", "inference", "--type=merge", "-p", '{"spec": {"slicing": {"sliceSize": "20G"}}}')
    generation = kind.json("get", "gsp", "inference")["metadata"]["generation"]

    def converged() -> bool:
        status = kind.json("get", "gsp", "inference").get("status") or {}
        return status.get("observedGeneration") == generation and any(
            c["type"] == "Ready" and c["status"] == "True" and c.get("observedGeneration") == generation
            for c in status.get("conditions", []))

    kind.wait_until("the edit that drains devices to be published", converged, within=300)
    assert apiserver_container(kind) == APISERVER["container"], "the API server was restarted"
    kind.kubectl("-n", "team-a", "delete", "pod", "inference", "--wait=true")
    helm(kind, "uninstall", *RELEASE, "--wait", "--timeout", "5m")
    kind.kubectl("delete", "crd", *CRDS)
    kind.kubectl("delete", "namespace", "gpuslice-system", "--wait=true")
    kind.kubectl("delete", "-f", kind.build["monitoringCrds"])
    kind.wait_until("the agents' slices to be gone", lambda: not kind.kubectl(
        "get", "resourceslices", "--field-selector", "spec.driver=gpu.gpuslice.dev", "-o", "name"), within=120)
    found = leftovers(kind)  # gpuslice-configmap-params stays: test_others.py installs again
    assert not found, "left behind:\n" + "\n".join(found)
    labels = kind.json("get", "namespace", "gpu-monitoring")["metadata"].get("labels", {})
    assert "resource.kubernetes.io/admin-access" not in labels
    nothing_left_on_the_nodes(kind)


def test_the_cli_installs_from_the_wheel_with_pipx_and_kubectl_finds_it(
    installed: Kind, releases: dict[str, Release], tmp_path: Path,
) -> None:
    """docs/release.md: `pipx install` of the release's wheel (PyPI for its dependencies, nothing else),
    `gpuslice` and `kubectl gpuslice` of the same version, and the krew plugin's launcher."""
    kind = installed
    wheel = releases["current"].dist / f"gpuslice-{__version__}-py3-none-any.whl"
    kind.run("python3", "-m", "venv", str(tmp_path / "pipx"))
    kind.run(str(tmp_path / "pipx/bin/pip"), "install", "--quiet", "pipx==1.18.4")
    env = {"PIPX_HOME": str(tmp_path / "home"), "PIPX_BIN_DIR": str(tmp_path / "bin")}
    done = subprocess.run([str(tmp_path / "pipx/bin/pipx"), "install", f"{wheel}[cli]"], capture_output=True,
                          text=True, env={**kind.env, **env}, timeout=600, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    said = {name: kind.run(str(tmp_path / "bin" / name), "--version").strip()
            for name in ("gpuslice", "kubectl-gpuslice")}
    assert said == {"gpuslice": f"gpuslice, version {__version__}",
                    "kubectl-gpuslice": f"kubectl-gpuslice, version {__version__}"}
    # kubectl finds it on PATH as a plugin.
    plugin_env = {**kind.env, "PATH": f"{tmp_path / 'bin'}:{kind.env['PATH']}"}
    listed = subprocess.run([kind.build["kubectl"], "gpuslice", "--version"], capture_output=True, text=True,
                            env=plugin_env, timeout=120, check=False)
    assert listed.stdout.strip() == f"kubectl-gpuslice, version {__version__}", listed.stderr
    # The krew plugin: its archive's launcher installs the wheel beside it on first use, then runs it.
    archive = releases["current"].dist / f"kubectl-gpuslice-{__version__}.tar.gz"
    unpacked = tmp_path / "krew"
    unpacked.mkdir()
    kind.run("tar", "-xzf", str(archive), "-C", str(unpacked))
    launched = subprocess.run([str(unpacked / "kubectl-gpuslice"), "--version"], capture_output=True, text=True,
                              env={**kind.env, "XDG_DATA_HOME": str(tmp_path / "data")}, timeout=600, check=False)
    assert launched.stdout.strip() == f"kubectl-gpuslice, version {__version__}", launched.stderr
