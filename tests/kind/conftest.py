"""The kind tier: the README's kind commands (make kind-up, kind-deploy, kind-demo, kind-undeploy),
run here against a kind cluster whose node image hack/kind/build.py made from Go modules and
Debian packages, with fake GPUs and the real kubelet, containerd and CDI.

`make test-kind` builds first; a missing build, Docker or kind is an error that fails the tier,
never a skip. GPUSLICE_KEEP_KIND=1 leaves the cluster up afterwards (kubeconfig path printed).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
# No "gpuslice" in it: the uninstall sweep looks for that name. GPUSLICE_KIND_CLUSTER runs the tier on
# a cluster of another name (two checkouts on one machine).
CLUSTER = os.environ.get("GPUSLICE_KIND_CLUSTER", "kind-tier")
TIMINGS: dict[str, float] = {}


def cache_dir() -> Path:
    explicit = os.environ.get("GPUSLICE_CACHE_DIR")
    if explicit:
        return Path(explicit) / "kind"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gpuslice" / "kind"


# One cluster for the tier, in this order: the image, the kustomize install (used, upgraded and
# uninstalled), the Helm chart on what that uninstall left, then another driver's claims through
# a kustomize install and an uninstall in the worst order.
FILES = ("test_image.py", "test_install.py", "test_helm.py", "test_others.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(pytest.mark.kind)
    items.sort(key=lambda item: FILES.index(item.path.name) if item.path.name in FILES else len(FILES))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    skipped = terminalreporter.stats.get("skipped", []) + terminalreporter.stats.get("xfailed", [])
    if skipped:
        terminalreporter.write_line(f"kind tier: {len(skipped)} test(s) skipped or xfailed, which fails the tier:",
                                    red=True)
        for report in skipped:
            terminalreporter.write_line(f"  {report.nodeid}")
    if TIMINGS:
        terminalreporter.write_line("kind tier timings: " + ", ".join(f"{k} {v:.0f} s" for k, v in TIMINGS.items()))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A skipped or xfailed check is a check that did not run: the tier fails rather than pass on it."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    stats = getattr(reporter, "stats", {})
    if (stats.get("skipped") or stats.get("xfailed")) and exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@dataclass
class Kind:
    """One kind cluster, and the commands the README gives, with this build's binaries and images."""

    build: dict[str, str]
    workdir: Path
    cluster: str = CLUSTER
    env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.kubeconfig = self.workdir / "kubeconfig"
        self.env = {**os.environ, "KUBECONFIG": str(self.kubeconfig),
                    "PATH": f"{self.build['binDir']}{os.pathsep}{os.environ['PATH']}"}

    def run(self, *args: str, input: str | None = None, check: bool = True, timeout: float = 900) -> str:
        done = subprocess.run(args, env=self.env, cwd=REPO, input=input, capture_output=True, text=True,
                              timeout=timeout, check=False)
        if check and done.returncode != 0:
            raise AssertionError(f"`{shlex.join(args)}` exited {done.returncode}:\n{done.stdout[-4000:]}\n"
                                 f"{done.stderr[-4000:]}")
        return done.stdout + done.stderr if not check else done.stdout

    def make(self, target: str, **variables: str) -> str:
        """A README target with this tier's binaries and images, its output streamed as it runs;
        returns the output, and records the time in TIMINGS."""
        settings = {"KIND": self.build["kind"], "KUBECTL": self.build["kubectl"], "KIND_CLUSTER": self.cluster,
                    **variables}
        args = ["make", "--no-print-directory", target, *(f"{k}={v}" for k, v in settings.items())]
        print(f"\n>>> {shlex.join(args)}", flush=True)
        started = time.monotonic()
        process = subprocess.Popen(args, env=self.env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   text=True)
        assert process.stdout is not None
        lines = []
        for line in process.stdout:
            print(f"  {line}", end="", flush=True)
            lines.append(line)
        TIMINGS[target] = time.monotonic() - started
        output = "".join(lines)
        if process.wait() != 0:
            raise AssertionError(f"`make {target}` exited {process.returncode}:\n{output[-6000:]}")
        return output

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> str:
        return self.run(self.build["kubectl"], *args, input=input, check=check)

    def json(self, *args: str) -> Any:
        return json.loads(self.kubectl(*args, "-o", "json"))

    def items(self, *args: str) -> list[dict[str, Any]]:
        return list(self.json("get", *args)["items"])

    def node_exec(self, node: str, *command: str) -> str:
        return self.run("docker", "exec", node, *command)

    @property
    def workers(self) -> list[str]:
        return [n["metadata"]["name"] for n in self.items("nodes")
                if n["metadata"].get("labels", {}).get("gpuslice.dev/gpu-backend") == "fake"]

    def wait_until(self, what: str, check: Any, within: float = 300, every: float = 2) -> Any:
        deadline = time.monotonic() + within
        while True:
            if result := check():
                return result
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {within:.0f} s waiting for {what}")
            time.sleep(every)


def cluster_config(build: dict[str, str]) -> dict[str, Any]:
    """kind/cluster.yaml with hack/kind/local-patch.yaml merged in, every node on the local image."""
    config: dict[str, Any] = yaml.safe_load((REPO / "kind/cluster.yaml").read_text())
    patch = yaml.safe_load((REPO / "hack/kind/local-patch.yaml").read_text())
    for key, value in patch.items():
        if isinstance(value, list):
            config[key] = [*config.get(key, []), *value]
        elif isinstance(value, dict):
            config[key] = {**config.get(key, {}), **value}
        else:
            config[key] = value
    for node in config["nodes"]:
        node["image"] = build["nodeImage"]
    return config


@pytest.fixture(scope="session")
def kind(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kind]:
    manifest = cache_dir() / "build.json"
    assert manifest.exists(), f"{manifest} is missing: run `make test-kind`, which builds the kind pieces first"
    build = json.loads(manifest.read_text())
    cluster = Kind(build, tmp_path_factory.mktemp("kind"))
    cluster.run(build["kind"], "delete", "cluster", "--name", CLUSTER)  # a crashed run's cluster
    config = cluster.workdir / "cluster.yaml"
    config.write_text(yaml.safe_dump(cluster_config(build), sort_keys=False))
    podnet = cluster.workdir / "podnet.yaml"
    podnet.write_text((REPO / "hack/kind/podnet.yaml").read_text().replace("PODNET_IMAGE", build["podnetImage"]))
    try:
        cluster.make("kind-up", KIND_CONFIG=str(config), KIND_CNI=str(podnet))
        yield cluster
    finally:
        if os.environ.get("GPUSLICE_KEEP_KIND"):
            print(f"kind cluster {CLUSTER} left up: KUBECONFIG={cluster.kubeconfig}")
        else:
            cluster.make("kind-down")


@pytest.fixture(scope="session")
def deployed(kind: Kind) -> Kind:
    kind.make("kind-deploy", IMAGE_BASE=kind.build["pythonBase"], TENANT_BASE=kind.build["busyboxBase"])
    return kind
