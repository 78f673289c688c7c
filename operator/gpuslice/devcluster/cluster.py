"""A real Kubernetes control plane on loopback, with fake GPU nodes.

etcd, kube-apiserver, kube-scheduler and kube-controller-manager run as child
processes on free ports. Each component authenticates with a certificate for
the identity a real cluster gives it, so RBAC, the Node authorizer and the
admission plugins we rely on behave as they do in production.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpuslice.coordinates import NODES, lease_path
from gpuslice.devcluster import audit as audit_module
from gpuslice.devcluster import binaries as binaries_module
from gpuslice.devcluster import features as features_module
from gpuslice.devcluster import mocknvml, operator
from gpuslice.devcluster.errors import DevClusterError
from gpuslice.devcluster.faults import FaultControls
from gpuslice.devcluster.mocknvml import MOCK_MODELS
from gpuslice.devcluster.nodes import (
    FAKE_GPU_MODELS,
    fake_gpu_node,
    node_layout,
    node_name,
    pod_runner_component,
    stop_mps_daemons,
)
from gpuslice.devcluster.pki import (
    WEBHOOK_CLIENT,
    CertificateAuthority,
    admission_configuration,
    admission_webhooks_kubeconfig,
    kubeconfig,
    service_account_key,
)
from gpuslice.devcluster.ports import ensure_port_free, free_port
from gpuslice.devcluster.process import Component, http_health
from gpuslice.devcluster.proxy import HoldableProxy
from gpuslice.devcluster.state import ClusterRecord, StateDir
from gpuslice.inventory.systems import SYSTEMS
from gpuslice.kube.client import KubeClient, KubeError

Reporter = Callable[[str], None]

# Controllers a GPU-slicing cluster needs. node-lifecycle and taint-eviction
# join only when pod runners heartbeat the fake nodes (otherwise they would
# mark every node unreachable).
CONTROLLERS = (
    "resourceclaim-controller",
    "device-taint-eviction-controller",
    "garbage-collector-controller",
    "namespace-controller",
    "resourcequota-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "root-ca-certificate-publisher-controller",
    # Tenants' workloads: the tenant guide's Deployments (docs/tenants.md) run here as they would anywhere.
    "deployment-controller",
    "replicaset-controller",
    # PodDisruptionBudgets' status, which the Eviction API reads (an overusing pod's eviction, agent/usage;
    # defragmentation's moves).
    "disruption-controller",
)
NODE_CONTROLLERS = ("node-lifecycle-controller", "taint-eviction-controller")
# A short grace, so a stopped runner shows as NotReady in seconds, not minutes.
NODE_MONITOR_FLAGS = ("--node-monitor-grace-period=20s", "--node-monitor-period=2s")
ADMIN_USER = "gpuslice-admin"
SERVICE_CIDR = "10.0.0.0/24"


def _quiet(_: str) -> None:
    pass


@dataclass(frozen=True)
class ClusterSpec:
    state_dir: Path
    nodes: int = 1
    gpus_per_node: int = 8
    gpu_model: str = "h100-80gb"
    apiserver_port: int | None = None
    operator: bool = False  # also install gpuslice and run its controller and node agents
    pod_runner: bool = False  # run a pod runner (the kubelet's DRA code) behind each fake node
    # The scheduler reaches the API server through a proxy a test can hold (faults: DevCluster.proxy).
    proxied_scheduler: bool = False
    # (model, count) of each node, when they differ (the demo's); overrides nodes, gpu_model, gpus_per_node
    shapes: tuple[tuple[str, int], ...] = ()
    # The Kubernetes minor ("1.36"); None: GPUSLICE_KUBE_VERSION's, else hack/kube/go.mod's (binaries.py).
    kube_version: str | None = None
    # fake: the agent's fake backend; nvml: its NVML backend on the mock NVML library (go-nvml's DGX mocks)
    # under a fake driver root, with a spec nvidia-ctk generated (devcluster/mocknvml.py; needs root)
    backend: str = "fake"

    def node_shapes(self) -> list[tuple[str, int]]:
        return list(self.shapes) or [(self.gpu_model, self.gpus_per_node)] * self.nodes

    def validate(self) -> None:
        if not 0 <= self.nodes <= 1000:
            raise DevClusterError(f"--nodes must be between 0 and 1000, not {self.nodes}.")
        if not 1 <= self.gpus_per_node <= 16:
            raise DevClusterError(
                f"--gpus-per-node must be between 1 and 16, not {self.gpus_per_node}."
            )
        if self.backend not in ("fake", "nvml"):
            raise DevClusterError(f"--gpu-backend must be fake or nvml, not {self.backend!r}.")
        for model, count in self.node_shapes():
            if self.backend == "nvml" and model not in MOCK_MODELS:
                raise DevClusterError(f"--gpu-model {model!r} has no go-nvml mock; with --gpu-backend nvml use one"
                                      f" of: {', '.join(MOCK_MODELS)}.")
            if self.backend == "fake" and model not in FAKE_GPU_MODELS:
                raise DevClusterError(
                    f"--gpu-model {model!r} is not a fake GPU model gpuslice knows; use one"
                    f" of: {', '.join(FAKE_GPU_MODELS)}."
                )
            if not 1 <= count <= 16:
                raise DevClusterError(f"--gpus-per-node must be between 1 and 16, not {count}.")


class DevCluster(FaultControls):
    """Start with :meth:`start` (or ``async with``); :meth:`stop` leaves nothing running."""

    def __init__(
        self,
        spec: ClusterSpec,
        *,
        binaries: binaries_module.Binaries | None = None,
        report: Reporter = _quiet,
    ) -> None:
        self.spec = spec
        self.state = StateDir(spec.state_dir)
        self._binaries = binaries
        self._report = report
        self.components: list[Component] = []
        self.server = ""
        self.kubernetes_version = ""
        self.features: features_module.Features | None = None
        self.node_names = [node_name(i) for i in range(1, len(spec.node_shapes()) + 1)]
        self.proxy: HoldableProxy | None = None
        self.scheduler_metrics = ""  # the kube-scheduler's /metrics (self-signed TLS, no credentials needed)

    @property
    def kubeconfig(self) -> Path:
        return self.state.kubeconfig

    @property
    def audit(self) -> audit_module.AuditLog:
        """What gpuslice's own identities asked the API server (devcluster.audit)."""
        return audit_module.AuditLog(self.state.logs / "audit.log")

    async def __aenter__(self) -> DevCluster:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        self.spec.validate()
        if self.spec.apiserver_port is not None:
            ensure_port_free(self.spec.apiserver_port, "the API server")
        note = self.state.prepare_fresh()
        if note:
            self._report(note)
        try:
            await self._start()
        except BaseException:
            await self.stop()
            raise

    async def _start(self) -> None:
        bins = self._binaries or await binaries_module.resolve(report=self._report, minor=self.spec.kube_version)
        binaries_module.check_executable(bins)
        version = await _version(bins["kube-apiserver"])
        self.kubernetes_version = "v{}.{}.{}".format(*version)
        wanted = binaries_module.parse_minor(self.spec.kube_version) if self.spec.kube_version else (
            binaries_module.requested_minor())
        if wanted is not None and f"{version[0]}.{version[1]}" != wanted:
            raise DevClusterError(
                f"Kubernetes {wanted} was asked for, but kube-apiserver ({bins.origins['kube-apiserver']}) is"
                f" {self.kubernetes_version}: point KUBEBUILDER_ASSETS at {wanted} binaries, or unset it to build them."
            )
        self.features = features_module.features_for(version)
        self._report(f"dev-cluster: Kubernetes {self.kubernetes_version} from {bins.origin}")

        ca = CertificateAuthority.create()
        ca_cert, _ = ca.pair.write(self.state.pki, "ca")
        sa_pub, sa_key = service_account_key().write(self.state.pki, "service-account")
        serving_cert, serving_key = ca.issue_server(
            "kube-apiserver",
            ["127.0.0.1", "localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"],
        ).write(self.state.pki, "apiserver")

        # The API server proves itself to admission webhooks with a client certificate of its own, as
        # docs/install.md has a real one do; the maxMemory webhook admits no other caller.
        webhooks = self.state.pki / "admission-webhooks.kubeconfig"
        webhooks.write_text(admission_webhooks_kubeconfig(ca.issue_client(WEBHOOK_CLIENT)))
        webhooks.chmod(0o600)
        admission = self.state.pki / "admission.yaml"
        admission.write_text(admission_configuration(webhooks.resolve()))

        etcd_port, etcd_peer = free_port(), free_port()
        api_port = self.spec.apiserver_port or free_port()
        self.server = f"https://127.0.0.1:{api_port}"
        etcd_url = f"http://127.0.0.1:{etcd_port}"

        def client_kubeconfig(user: str, groups: tuple[str, ...], path: Path, server: str | None = None) -> Path:
            pair = ca.issue_client(user, groups)
            path.write_text(kubeconfig(server or self.server, ca.pair, pair, user, "gpuslice-dev"))
            path.chmod(0o600)
            return path

        scheduler_server = None
        if self.spec.proxied_scheduler:
            self.proxy = HoldableProxy("kube-scheduler", api_port)
            scheduler_server = f"https://127.0.0.1:{await self.proxy.start(free_port())}"

        admin = client_kubeconfig(ADMIN_USER, ("system:masters",), self.state.kubeconfig)
        scheduler_kc = client_kubeconfig(
            "system:kube-scheduler", (), self.state.pki / "kube-scheduler.kubeconfig", scheduler_server
        )
        kcm_kc = client_kubeconfig(
            "system:kube-controller-manager", (), self.state.pki / "kube-controller-manager.kubeconfig"
        )

        logs = self.state.logs
        etcd = Component(
            "etcd",
            [str(bins["etcd"]), "--name=gpuslice", f"--data-dir={self.state.etcd_data}",
             f"--listen-client-urls={etcd_url}", f"--advertise-client-urls={etcd_url}",
             f"--listen-peer-urls=http://127.0.0.1:{etcd_peer}",
             f"--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer}",
             f"--initial-cluster=gpuslice=http://127.0.0.1:{etcd_peer}",
             "--unsafe-no-fsync=true", "--log-level=warn"],
            logs / "etcd.log", http_health(f"{etcd_url}/health"), startup_timeout=30,
        )
        await self._launch(etcd)

        ca_context = ssl.create_default_context(cafile=str(ca_cert))
        apiserver = Component(
            "kube-apiserver",
            [str(bins["kube-apiserver"]), f"--etcd-servers={etcd_url}",
             "--bind-address=127.0.0.1", f"--secure-port={api_port}",
             f"--tls-cert-file={serving_cert}", f"--tls-private-key-file={serving_key}",
             f"--client-ca-file={ca_cert}",
             f"--service-account-issuer={self.server}",
             f"--service-account-key-file={sa_pub}",
             f"--service-account-signing-key-file={sa_key}",
             f"--service-cluster-ip-range={SERVICE_CIDR}",
             "--authorization-mode=Node,RBAC",
             "--enable-admission-plugins=NodeRestriction,ValidatingAdmissionPolicy,ResourceQuota",
             f"--admission-control-config-file={admission.resolve()}",
             "--disable-admission-plugins=TaintNodesByCondition",
             "--endpoint-reconciler-type=none",
             "--allow-privileged=true",
             *audit_module.apiserver_flags(self.state.pki / "audit-policy.yaml", self.audit.path),
             *self.features.flags(apiserver=True)],
            logs / "kube-apiserver.log", http_health(f"{self.server}/readyz", ca_context),
            startup_timeout=90,
        )
        await self._launch(apiserver)

        scheduler_port, kcm_port = free_port(), free_port()
        self.scheduler_metrics = f"https://127.0.0.1:{scheduler_port}/metrics"
        insecure = ssl.create_default_context()
        insecure.check_hostname, insecure.verify_mode = False, ssl.CERT_NONE
        scheduler = Component(
            "kube-scheduler",
            [str(bins["kube-scheduler"]), f"--kubeconfig={scheduler_kc}",
             f"--authentication-kubeconfig={scheduler_kc}",
             f"--authorization-kubeconfig={scheduler_kc}",
             "--leader-elect=false", "--bind-address=127.0.0.1",
             f"--secure-port={scheduler_port}", f"--cert-dir={self.state.pki / 'kube-scheduler'}",
             # Loopback only: its metrics (e.g. pods in their binding cycle) readable without the API server.
             "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics",
             *self.features.flags()],
            logs / "kube-scheduler.log",
            http_health(f"https://127.0.0.1:{scheduler_port}/healthz", insecure),
        )
        controller_manager = Component(
            "kube-controller-manager",
            [str(bins["kube-controller-manager"]), f"--kubeconfig={kcm_kc}",
             f"--authentication-kubeconfig={kcm_kc}", f"--authorization-kubeconfig={kcm_kc}",
             "--leader-elect=false", "--bind-address=127.0.0.1",
             f"--secure-port={kcm_port}", f"--cert-dir={self.state.pki / 'kube-controller-manager'}",
             f"--controllers={','.join(self._controllers())}",
             *(NODE_MONITOR_FLAGS if self.spec.pod_runner else ()),
             "--use-service-account-credentials=true",
             f"--service-account-private-key-file={sa_key}", f"--root-ca-file={ca_cert}",
             *self.features.flags()],
            logs / "kube-controller-manager.log",
            http_health(f"https://127.0.0.1:{kcm_port}/healthz", insecure),
        )
        self._report("dev-cluster: starting kube-scheduler and kube-controller-manager")
        await asyncio.gather(*(c.start() for c in (scheduler, controller_manager)))
        self.components += [scheduler, controller_manager]
        await asyncio.gather(*(c.wait_healthy() for c in (scheduler, controller_manager)))

        await self._create_nodes(admin)
        if self.spec.pod_runner:
            await self._start_pod_runners(bins, ca)
        if self.spec.operator:
            await self._start_operator(admin, ca.pair.cert_pem)
        self._write_record()

    def webhook_client_flags(self) -> list[str]:
        """The maxMemory webhook's flags that admit the API server, and only it, as a caller: its
        client certificate is of the dev cluster's CA, which signs every other identity's too."""
        return [f"--client-ca-file={self.state.pki / 'ca.crt'}", f"--client-allowed-names={WEBHOOK_CLIENT}"]

    def _write_record(self) -> None:
        self.state.write_record(ClusterRecord(
            supervisor_pid=os.getpid(), server=self.server, kubeconfig=str(self.state.kubeconfig),
            kubernetes_version=self.kubernetes_version,
            components={c.name: c.pid for c in self.components if c.pid},
            nodes=self.node_names,
        ))

    def _controllers(self) -> tuple[str, ...]:
        return (*CONTROLLERS, *NODE_CONTROLLERS) if self.spec.pod_runner else CONTROLLERS

    def node_dir(self, node: str) -> Path:
        """A fake node's own directory: plugins_registry/, plugins/, cdi/, dra-state/, containers/ (the pod
        runner's), and agent/ (the node agent's state: claim checkpoints, fake GPUs); ``nodes/<node>``
        of the state directory, or where that links to (see ``StateDir.node_dir``)."""
        return self.state.node_dir(node)

    async def _start_pod_runners(self, bins: binaries_module.Binaries, ca: CertificateAuthority) -> None:
        if bins.pod_runner is None:
            raise DevClusterError(
                "No pod-runner binary: it is built with the control plane by `make kube-bin` (or set"
                " TEST_ASSET_POD_RUNNER). Use --no-pod-runner to run fake nodes without one."
            )
        for node in self.node_names:
            root = self.node_dir(node)
            node_kubeconfig = node_layout(root, node, self.server, ca)
            await self._launch(pod_runner_component(bins.pod_runner, node, root, node_kubeconfig,
                                                    self.state.logs / f"pod-runner-{node}.log",
                                                    self.lease_exists(node)))

    def lease_exists(self, node: str) -> Callable[[], Awaitable[bool]]:
        async def check() -> bool:
            async with await KubeClient.from_kubeconfig(self.state.kubeconfig) as kube:
                try:
                    await kube.get(lease_path("kube-node-lease", node))
                except KubeError:
                    return False
            return True

        return check

    async def _launch(self, component: Component) -> None:
        self._report(f"dev-cluster: starting {component.name}")
        await component.start()
        self.components.append(component)
        await component.wait_healthy()

    async def _create_nodes(self, admin_kubeconfig: Path) -> None:
        async with await KubeClient.from_kubeconfig(admin_kubeconfig) as kube:
            for name, (model, count) in zip(self.node_names, self.spec.node_shapes(), strict=True):
                body = fake_gpu_node(name, model, count, self.spec.backend,
                                     system=model if model in SYSTEMS else None)
                try:
                    await kube.create(NODES, body)
                except KubeError as error:
                    raise DevClusterError(f"Creating fake GPU node {name} failed: {error}") from error
        for name, (model, count) in zip(self.node_names, self.spec.node_shapes(), strict=True):
            what = SYSTEMS[model].title if model in SYSTEMS else f"{count} x {model}"
            self._report(f"dev-cluster: fake GPU node {name} with {what}")

    async def _start_operator(self, admin_kubeconfig: Path, ca_pem: bytes) -> None:
        webhook_port = free_port()
        async with await KubeClient.from_kubeconfig(admin_kubeconfig) as kube:
            kubeconfig, webhook = await operator.install(kube, self.state.root, self.server, ca_pem, webhook_port)
            agents = {node: await operator.agent_kubeconfig(kube, node, self.state.root, self.server, ca_pem)
                      for node in self.node_names}
        await self._launch(operator.controller_component(kubeconfig, self.state.logs / "gpuslice-controller.log",
                                                         free_port()))
        await self._launch(operator.webhook_component(webhook, self.state.logs / "gpuslice-webhook.log",
                                                      webhook_port, free_port(),
                                                      extra_args=self.webhook_client_flags()))
        shapes = dict(zip(self.node_names, self.spec.node_shapes(), strict=True))
        for node, agent_kubeconfig in agents.items():
            backend: Sequence[str] = ("--backend=fake",)
            if self.spec.backend == "nvml":
                model, count = shapes[node]
                self._report(f"dev-cluster: {node}'s driver root on the mock NVML library, its spec by nvidia-ctk")
                nvml = await asyncio.to_thread(mocknvml.prepare_node, self.node_dir(node), node, model, count)
                backend = nvml.agent_args()
            await self._launch(operator.agent_component(node, agent_kubeconfig,
                                                        self.state.logs / f"gpuslice-agent-{node}.log", free_port(),
                                                        self.node_dir(node), backend=backend))

    def dead_component(self) -> Component | None:
        """The first component that has exited, if any (for supervisors)."""
        return next((c for c in self.components if not c.running), None)

    async def stop(self) -> None:
        """Stop every component, newest first, and forget the cluster."""
        for component in reversed(self.components):
            await component.stop()
        self.components.clear()
        for node in self.node_names:
            stop_mps_daemons(self.node_dir(node))
        if self.proxy is not None:
            await self.proxy.stop()
            self.proxy = None
        record = self.state.read_record() if self.state.record_path.exists() else None
        if record is None or record.supervisor_pid == os.getpid():
            self.state.remove_record()


async def _version(apiserver: Path) -> tuple[int, int, int]:
    try:
        process = await asyncio.create_subprocess_exec(
            str(apiserver), "--version",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )
    except OSError as error:
        raise DevClusterError(
            f"Could not run {apiserver} --version: {error.strerror}. Point TEST_ASSET_KUBE_APISERVER"
            " or KUBEBUILDER_ASSETS at a working binary, or unset them and run `make kube-bin`."
        ) from error
    with contextlib.suppress(TimeoutError):
        out, _ = await asyncio.wait_for(process.communicate(), 30)
        if process.returncode == 0:
            return features_module.parse_version(out.decode(errors="replace"))
    raise DevClusterError(
        f"{apiserver} --version failed (exit {process.returncode}); it is not a working"
        " kube-apiserver. Fix TEST_ASSET_KUBE_APISERVER / KUBEBUILDER_ASSETS or run `make kube-bin`."
    )


def stderr_reporter(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
