"""The kind tier: the README's kind commands (make kind-up, kind-deploy, kind-demo, kind-undeploy),
run here against a kind cluster whose node image hack/kind/build.py made from Go modules and
Debian packages, with fake GPUs and the real kubelet, containerd and CDI; two more workers run the
agent's NVML backend on the mock NVML library beside NVIDIA's nvidia-ctk and device plugin (test_nvidia.py;
`make test-kind` builds those with `make nvidia-bin`).

`make test-kind` builds first; a missing build, Docker or kind is an error that fails the tier,
never a skip. GPUSLICE_KEEP_KIND=1 leaves the cluster up afterwards (kubeconfig path printed).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.kind import nvidia
from tests.kind.kindutil import CLUSTER, REPO, TIMINGS, Kind, cache_dir, cluster_config

# One cluster for the tier, in this order: the image, the NVML nodes on the first kustomize install
# (NVIDIA's code: tests/kind/test_nvidia.py), the kustomize install (used, upgraded and uninstalled), the Helm chart on what that uninstall left, then another driver's claims through
# a kustomize install and an uninstall in the worst order.
FILES = ("test_image.py", "test_nvidia.py", "test_install.py", "test_helm.py", "test_others.py")


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


@pytest.fixture(scope="session")
def kind(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kind]:
    manifest = cache_dir() / "build.json"
    assert manifest.exists(), f"{manifest} is missing: run `make test-kind`, which builds the kind pieces first"
    build = json.loads(manifest.read_text())
    cluster = Kind(build, tmp_path_factory.mktemp("kind"))
    cluster.run(build["kind"], "delete", "cluster", "--name", CLUSTER)  # a crashed run's cluster
    config = cluster.workdir / "cluster.yaml"
    # The NVML workers' driver roots, laid out before kind mounts them (tests/kind/nvidia.py).
    nvml_nodes = nvidia.node_entries(nvidia.prepare(cluster.workdir))
    config.write_text(yaml.safe_dump(cluster_config(build, nvml_nodes), sort_keys=False))
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
