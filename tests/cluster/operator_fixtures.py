"""The controller as it runs for real: its own process, its own ServiceAccount and the
RBAC of manifests/, against the session's control plane."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuslice.devcluster.cluster import DevCluster
from gpuslice.kube.client import KubeClient, KubeError
from tests.cluster.kubeutil import create_namespace, delete_namespace, wait_for

MANIFESTS = Path(__file__).resolve().parents[2] / "manifests"
RBAC = MANIFESTS / "controller-rbac.yaml"
ADMISSION = MANIFESTS / "admission.yaml"
CONTROLLER_USER = "system:serviceaccount:gpuslice-system:gpuslice-controller"
# Leader election with short timers (ControllerSettings): a killed copy's successor takes over in
# seconds rather than the 15 s a production Lease waits.
LEASE_ENV = {"GPUSLICE_LEASE_DURATION": "5", "GPUSLICE_RENEW_DEADLINE": "3.5", "GPUSLICE_RETRY_PERIOD": "1",
             # The API server calls the maxMemory webhook on loopback (memory_webhook below).
             "GPUSLICE_WEBHOOK_HOSTS": "127.0.0.1",
             # Auto defragmentation looks every 2 s rather than 30 (the defrag tests wait for it).
             "GPUSLICE_DEFRAG_INTERVAL": "2",
             # Pods the scheduler turned away whose devices are free: asked about every 3 s, not 30.
             "GPUSLICE_SCHEDULER_RETRY_INTERVAL": "3"}
WEBHOOK_RBAC = MANIFESTS / "webhook-rbac.yaml"
WEBHOOK_USER = "system:serviceaccount:gpuslice-system:gpuslice-webhook"


async def apply_manifests(kube: KubeClient, text: str) -> None:
    from gpuslice.kube.paths import object_path

    for doc in yaml.safe_load_all(text):
        if doc:
            await kube.apply(object_path(doc), doc, field_manager="gpuslice-tests")


async def write_controller_kubeconfig(cluster: DevCluster, kube: KubeClient, directory: Path,
                                     account: str = "gpuslice-controller", rbac: str | None = None,
                                     namespace: str = "gpuslice-system") -> Path:
    """A kubeconfig with a token of the controller's ServiceAccount (manifests/controller-rbac.yaml),
    or of another of gpuslice's (``account``, with its RBAC manifests ``rbac``), in ``namespace``
    (gpuslice's own: another where the chart installs it elsewhere)."""
    await apply_manifests(kube, rbac if rbac is not None else RBAC.read_text())
    token = await kube.create(
        f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 86400}},
    )
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    config = {
        "apiVersion": "v1", "kind": "Config",
        "clusters": admin["clusters"],
        "users": [{"name": account, "user": {"token": token["status"]["token"]}}],
        "contexts": [{"name": "controller", "context": {"cluster": admin["clusters"][0]["name"], "user": account}}],
        "current-context": "controller",
    }
    path = directory / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return path


async def bound_identity(cluster: DevCluster, kube: KubeClient, directory: Path, name: str,
                         cluster_roles: tuple[str, ...]) -> Path:
    """A kubeconfig of a ServiceAccount ``default/<name>`` bound to ``cluster_roles`` only (a person
    given those roles). The authorizer may see the bindings a moment later."""
    await apply_manifests(kube, yaml.safe_dump_all([
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": "default"}},
        *[{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
           "metadata": {"name": f"{name}-{role}"},
           "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
           "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": "default"}]}
          for role in cluster_roles]]))
    token = await kube.create(f"/api/v1/namespaces/default/serviceaccounts/{name}/token", {
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 3600}})
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    path = directory / f"{name}.kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "clusters": admin["clusters"],
        "users": [{"name": name, "user": {"token": token["status"]["token"]}}],
        "contexts": [{"name": name, "context": {"cluster": admin["clusters"][0]["name"], "user": name}}],
        "current-context": name}))
    return path


@pytest.fixture(scope="session")
async def controller_kubeconfig(cluster: DevCluster, kube: KubeClient, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return await write_controller_kubeconfig(cluster, kube, tmp_path_factory.mktemp("controller"))


async def stop_group(process: subprocess.Popen[bytes] | None, sig: int, within: float) -> None:
    """Send ``sig`` to the process's group, and SIGKILL it if it has not exited ``within`` seconds."""
    if process is None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, sig)
    for _ in range(int(within * 10)):
        if process.poll() is not None:
            return
        await asyncio.sleep(0.1)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()


class ControllerProcess:
    """`gpuslice controller` in a subprocess, so tests can kill and restart it."""

    def __init__(self, kubeconfig: Path, log: Path, env: dict[str, str] | None = None) -> None:
        from gpuslice.devcluster.cluster import free_port

        self.kubeconfig, self.log, self.env = kubeconfig, log, dict(env or {})
        self.metrics_port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "gpuslice", "controller", "--kubeconfig", str(self.kubeconfig),
                 "--metrics-port", str(self.metrics_port)],
                stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True,
                env={**os.environ, **LEASE_ENV, **self.env},
            )

    async def stop(self, sig: int = signal.SIGTERM) -> None:
        await stop_group(self.process, sig, 20)
        self.process = None

    def pause(self) -> None:
        """Freeze the controller (SIGSTOP): what a slow or starved controller looks like."""
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGCONT)

    async def restart(self, sig: int = signal.SIGTERM) -> None:
        await self.stop(sig)
        self.start()

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


@pytest.fixture(scope="session")
async def controller(
    policy_crd: str, controller_kubeconfig: Path, kube: KubeClient, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[ControllerProcess]:
    # As a user installs gpuslice: the CRD (policy_crd), RBAC, then the admission policies.
    await apply_manifests(kube, ADMISSION.read_text())
    await admin_label_guarded(kube)
    process = ControllerProcess(controller_kubeconfig, tmp_path_factory.mktemp("controller-log") / "controller.log")
    process.start()

    async def started() -> bool:
        assert process.process is not None
        assert process.process.poll() is None, process.log_text()[-3000:]
        return "controller started" in process.log_text()

    await wait_for(started, within=60, what="the controller to start")
    yield process
    await process.stop()


async def admin_label_guarded(kube: KubeClient) -> None:
    """Wait until the guard binding is enforced, not just stored (the apiserver loads it a moment later)."""
    probe = "gpuslice-guard-probe"

    async def refused() -> bool:
        labels = {"resource.kubernetes.io/admin-access": "true"}
        try:
            await kube.create("/api/v1/namespaces", {"metadata": {"name": probe, "labels": labels}})
        except KubeError as error:
            if "only the gpuslice controller" in error.message:
                return True
            if error.status != 409:  # 409: the last probe is still being deleted
                raise
            return False
        await kube.delete(f"/api/v1/namespaces/{probe}")
        return False

    await wait_for(refused, within=30, what="the admin-access label guard to be enforced")


PolicyFactory = Callable[..., Awaitable[dict[str, Any]]]


@pytest.fixture
async def make_policy(kube: KubeClient, policy_crd: str, unique: str) -> AsyncIterator[PolicyFactory]:
    """Create policies named after the test; delete them (and wait until gone) afterwards."""
    names: list[str] = []

    async def create(spec: dict[str, Any], suffix: str = "") -> dict[str, Any]:
        name = f"p-{unique}{suffix}"
        names.append(name)
        return await kube.create(policy_crd, {
            "apiVersion": "gpuslice.dev/v1alpha1", "kind": "GpuSlicePolicy", "metadata": {"name": name}, "spec": spec,
        })

    yield create
    for name in reversed(names):
        with contextlib.suppress(KubeError):
            await kube.delete(f"{policy_crd}/{name}")
    for name in names:
        async def gone(name: str = name) -> bool:
            try:
                await kube.get(f"{policy_crd}/{name}")
            except KubeError as error:
                return error.status == 404
            return False

        await wait_for(gone, within=60, what=f"policy {name} to be deleted")


@pytest.fixture
async def namespaces(kube: KubeClient, unique: str) -> AsyncIterator[Callable[..., Awaitable[str]]]:
    """Create extra namespaces for a test; delete them afterwards."""
    created: list[str] = []

    async def create(suffix: str, labels: dict[str, str] | None = None) -> str:
        name = await create_namespace(kube, f"{suffix}-{unique}", labels)
        created.append(name)
        return name

    yield create
    for name in created:
        await delete_namespace(kube, name)


async def judged_before_the_policy(kube: KubeClient, make_policy: PolicyFactory, namespaces: list[str],
                                   klass: str) -> None:
    """Make ``namespaces`` tenants of another policy (on no node), so that they are labelled
    gpuslice.dev/tenancy=judged and claims of ``klass`` (a policy that does not exist yet) can be
    made there: the one way claims can be made before their policy. Anywhere else, a claim of a
    gpuslice class in a namespace no policy names is refused when it is made, checked here first."""
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "early-probe"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": klass}}]}}}
    for namespace in namespaces:
        with pytest.raises(KubeError) as refused:
            await kube.create(f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims", body, dryRun="All")
        assert "gpuslice-non-tenants" in refused.value.message, refused.value.message
        assert "is not a tenant" in refused.value.message
    # Its own template name: two policies may not make the same template in a namespace.
    await make_policy({"nodeSelector": {"matchLabels": {"gpuslice.dev/no-such-node": "true"}},
                       "slicing": {"mode": "memory", "sliceSize": "10G"}, "claimTemplateName": "other-slice",
                       "tenants": [{"namespace": n} for n in namespaces]}, "-other")

    async def labelled() -> bool:
        for namespace in namespaces:
            labels = (await kube.get(f"/api/v1/namespaces/{namespace}"))["metadata"].get("labels") or {}
            if labels.get("gpuslice.dev/tenancy") != "judged":
                return False
        return True

    await wait_for(labelled, within=30, what=f"namespaces {namespaces} to be labelled as judged")


class WebhookProcess:
    """`gpuslice webhook` in a subprocess on loopback, where the session's API server calls it by
    URL (manifests/memory-webhook.yaml with a url), so tests can kill and restart it."""

    def __init__(self, kubeconfig: Path, log: Path, env: dict[str, str] | None = None,
                 args: list[str] | None = None) -> None:
        """``args``: more flags (the session cluster's ``webhook_client_flags()``: only its API server may call)."""
        from gpuslice.devcluster.cluster import free_port

        self.kubeconfig, self.log = kubeconfig, log
        self.port, self.metrics_port = free_port(), free_port()
        self.env, self.args = dict(env or {}), list(args or [])
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "gpuslice", "webhook", "--kubeconfig", str(self.kubeconfig),
                 "--address", "127.0.0.1", "--port", str(self.port), "--metrics-port", str(self.metrics_port),
                 *self.args],
                stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True,
                env={**os.environ, **self.env},
            )

    async def ready(self, within: float = 60) -> None:
        import aiohttp

        async def answers() -> bool:
            assert self.process is not None
            assert self.process.poll() is None, self.log_text()[-3000:]
            try:
                async with aiohttp.ClientSession() as session, session.get(
                        f"http://127.0.0.1:{self.metrics_port}/readyz") as response:
                    return response.status == 200
            except aiohttp.ClientError:
                return False

        await wait_for(answers, within=within, what="the maxMemory webhook to serve")

    async def stop(self, sig: int = signal.SIGTERM) -> None:
        await stop_group(self.process, sig, 10)
        self.process = None

    async def restart(self, sig: int = signal.SIGTERM, env: dict[str, str] | None = None) -> None:
        await self.stop(sig)
        if env is not None:
            self.env = env
        self.start()
        await self.ready()

    async def metrics(self) -> str:
        import aiohttp

        async with aiohttp.ClientSession() as session, session.get(
                f"http://127.0.0.1:{self.metrics_port}/metrics") as response:
            return await response.text()

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


# Short timers, so that a charge for a write that never happened is released within the tests' time.
WEBHOOK_ENV = {"GPUSLICE_CHARGE_GRACE": "8", "GPUSLICE_RESYNC": "5", "GPUSLICE_TLS_INTERVAL": "2"}


@pytest.fixture(scope="session")
async def memory_webhook(cluster: DevCluster, kube: KubeClient, controller: ControllerProcess,
                         tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[WebhookProcess]:
    """The maxMemory webhook, as the dev cluster runs it: its RBAC, its configuration by URL, its own
    ServiceAccount; its certificate made by the session's controller."""
    from gpuslice.devcluster.operator import webhook_url
    from gpuslice.planning.cluster.memory_rule import memory_webhook as webhook_config

    directory = tmp_path_factory.mktemp("webhook")
    kubeconfig = await write_controller_kubeconfig(cluster, kube, directory, "gpuslice-webhook",
                                                 WEBHOOK_RBAC.read_text())
    process = WebhookProcess(kubeconfig, directory / "webhook.log", WEBHOOK_ENV, cluster.webhook_client_flags())
    await apply_manifests(kube, yaml.safe_dump(webhook_config(url=webhook_url(process.port))))
    process.start()
    await process.ready(90)

    async def trusted() -> bool:
        """The API server calls it and trusts its certificate: the controller wrote the caBundle."""
        from gpuslice.controller.tenancy import memory_webhook_unenforced

        return await memory_webhook_unenforced(kube, "gpuslice-system") is None

    await wait_for(trusted, within=60, what="the API server to call the maxMemory webhook (the controller's caBundle)")
    yield process
    await process.stop()
