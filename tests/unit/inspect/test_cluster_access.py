"""``gpuslice status|why|plan --cluster`` and ``kubectl gpuslice`` as processes, against a loopback API
server: which kubeconfig, context and namespace they use, what they say when there is none, and that
no debug line reaches the terminal."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gpuslice.devcluster.pki import CertificateAuthority
from tests.unit.kube.loopback import ApiServer, ca_data, kubeconfig

BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def ca() -> CertificateAuthority:
    return CertificateAuthority.create()


@pytest.fixture
async def api(ca: CertificateAuthority, tmp_path: Path) -> AsyncIterator[ApiServer]:
    server = await ApiServer(ca, ["127.0.0.1"]).start(tmp_path)
    yield server
    await server.stop()


def two_contexts(path: Path, ca: CertificateAuthority, port: int) -> Path:
    """``dev`` (current) reaches nothing; ``prod`` reaches the loopback server, in namespace team-a."""
    return kubeconfig(path, current="dev",
                      contexts={"dev": {"cluster": "dev", "user": "u"},
                                "prod": {"cluster": "prod", "user": "u", "namespace": "team-a"}},
                      clusters={"dev": {"server": "https://127.0.0.1:1"},
                                "prod": {"server": f"https://127.0.0.1:{port}",
                                         "certificate-authority-data": ca_data(ca)}},
                      users={"u": {"token": "t"}})


async def run(*args: str, home: Path, environ: dict[str, str] | None = None,
              program: str = "gpuslice") -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBE", "GPUSLICE_"))}
    env.update({"HOME": str(home), **(environ or {})})
    process = await asyncio.create_subprocess_exec(str(BIN / program), *args, env=env,
                                                   stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(process.communicate(), 60)
    return process.returncode or 0, out.decode(), err.decode()


async def test_why_takes_the_contexts_namespace(api: ApiServer, ca: CertificateAuthority, tmp_path: Path) -> None:
    path = two_contexts(tmp_path / "config", ca, api.port)
    rc, out, err = await run("why", "trainer", "--context", "prod", "-o", "json", "--kubeconfig", str(path),
                             home=tmp_path)
    assert rc == 1, err  # no such pod: the answer says so, and so does the exit status
    assert json.loads(out)["subject"] == "team-a/trainer"
    assert "/api/v1/namespaces/team-a/pods/trainer" in api.paths
    rc, out, _ = await run("why", "trainer", "-n", "other", "--context", "prod", "-o", "json", "--kubeconfig",
                           str(path), home=tmp_path)
    assert json.loads(out)["subject"] == "other/trainer"  # -n wins over the context


async def test_why_without_a_pod_lists_a_namespace_or_all(api: ApiServer, ca: CertificateAuthority,
                                                          tmp_path: Path) -> None:
    path = two_contexts(tmp_path / "config", ca, api.port)
    rc, out, err = await run("why", "--context", "prod", "-o", "json", home=tmp_path,
                             environ={"KUBECONFIG": str(path)})
    assert (rc, json.loads(out)) == (0, []), err
    assert "/api/v1/namespaces/team-a/pods?fieldSelector=status.phase%3DPending" in api.paths
    rc, out, _ = await run("why", "-A", "--context", "prod", home=tmp_path, environ={"KUBECONFIG": str(path)})
    assert "/api/v1/pods?fieldSelector=status.phase%3DPending" in api.paths
    assert "No Pending pod in any namespace asks for a gpuslice device." in out
    rc, _, err = await run("why", "trainer", "-A", home=tmp_path, environ={"KUBECONFIG": str(path)})
    assert rc == 2
    assert "cannot be looked up by name across all namespaces" in err


async def test_the_kubectl_plugin_and_plan_take_the_context_too(api: ApiServer, ca: CertificateAuthority,
                                                                tmp_path: Path) -> None:
    path = two_contexts(tmp_path / "config", ca, api.port)
    rc, _, err = await run("status", "-o", "json", "--context", "prod", "--kubeconfig", str(path),
                           home=tmp_path, program="kubectl-gpuslice")
    assert rc == 0, err
    policy = tmp_path / "policy.yaml"
    policy.write_text("apiVersion: gpuslice.dev/v1alpha1\nkind: GpuSlicePolicy\nmetadata: {name: p}\n"
                      "spec: {slicing: {mode: memory, sliceSize: 10G}, tenants: [{namespace: a}]}\n")
    rc, _, err = await run("plan", "-f", str(policy), "-o", "json", "--context", "prod", home=tmp_path,
                             program="kubectl-gpuslice", environ={"KUBECONFIG": str(path)})
    assert rc == 0, err
    rc, _, err = await run("plan", "--cluster", "-f", str(policy), "-o", "json", "--context", "prod",
                             home=tmp_path, environ={"GPUSLICE_KUBECONFIG": str(path)})
    assert rc == 0, err
    agents = {s.one("User-Agent") or "" for s in api.seen}
    assert agents
    assert all(a.startswith("gpuslice-cli/") for a in agents), agents


async def test_home_kubeconfig_is_read_and_the_flag_wins(api: ApiServer, ca: CertificateAuthority,
                                                         tmp_path: Path) -> None:
    (tmp_path / ".kube").mkdir()
    two_contexts(tmp_path / ".kube" / "config", ca, api.port)
    rc, _, err = await run("status", "-o", "json", "--context", "prod", home=tmp_path)
    assert rc == 0, err
    rc, _, err = await run("status", "--context", "prod", "--kubeconfig", str(tmp_path / "absent"), home=tmp_path)
    assert rc == 1
    assert "absent (given with --kubeconfig) does not exist" in err


async def test_no_kubeconfig_and_no_pod_says_exactly_that(tmp_path: Path) -> None:
    rc, out, err = await run("status", home=tmp_path)
    assert (rc, out) == (1, "")
    assert err.startswith("gpuslice: no kubeconfig found (~/.kube/config: no such file) and not in a pod"), err
    assert "Config not found" not in err  # kubernetes_asyncio's words are gone
    assert "kube-config" not in err
    assert len(err.strip().splitlines()) == 1


async def test_an_unreachable_server_prints_one_line_and_no_debug(ca: CertificateAuthority, tmp_path: Path) -> None:
    path = two_contexts(tmp_path / "config", ca, 1)
    rc, out, err = await run("why", "default/x", "--kubeconfig", str(path), home=tmp_path)
    assert (rc, out) == (1, "")
    assert "debug" not in err.lower()
    assert "retrying" not in err
    assert len(err.strip().splitlines()) == 1, err


async def test_a_refused_field_is_named(ca: CertificateAuthority, tmp_path: Path) -> None:
    path = kubeconfig(tmp_path / "config", current="c", contexts={"c": {"cluster": "c", "user": "u"}},
                      clusters={"c": {"server": "https://127.0.0.1:1"}},
                      users={"u": {"token": "t", "as-groups": ["admins"]}})
    rc, _, err = await run("status", "--kubeconfig", str(path), home=tmp_path)
    assert rc == 1
    assert "as-uid, as-groups or as-user-extra without as" in err


async def test_bad_tls_material_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    path = kubeconfig(tmp_path / "config", current="c", contexts={"c": {"cluster": "c", "user": "u"}},
                      clusters={"c": {"server": "https://127.0.0.1:1", "certificate-authority-data": "AAAA"}},
                      users={"u": {"token": "t"}})
    for command in (["status"], ["controller"]):
        rc, _, err = await run(*command, "--kubeconfig", str(path), home=tmp_path)
        assert rc == 1, err
        assert "certificate-authority-data: not PEM" in err
        assert "Traceback" not in err


def test_an_exported_context_does_not_break_an_offline_plan(tmp_path: Path) -> None:
    """GPUSLICE_CONTEXT exported for status and why must not make ``gpuslice plan -f`` (no cluster)
    fail; only --context given on the command line, where it does nothing, is a usage error."""
    from click.testing import CliRunner

    from gpuslice.cli import main

    policy = Path(__file__).resolve().parents[3] / "examples" / "policies" / "inference-memory.yaml"
    runner = CliRunner()
    done = runner.invoke(main, ["plan", "-f", str(policy)], env={"GPUSLICE_CONTEXT": "prod"})
    assert done.exit_code == 0, done.output
    assert "ResourceSlice" in done.output
    refused = runner.invoke(main, ["plan", "-f", str(policy), "--context", "prod"])
    assert refused.exit_code == 2
    assert "--context is for a plan against a cluster" in refused.output


def _pending(namespace: str, name: str, **spec: Any) -> dict[str, Any]:
    return {"metadata": {"namespace": namespace, "name": name, "creationTimestamp": "2026-12-01T00:00:00Z"},
            "spec": {"containers": [{"name": "main"}], **spec}, "status": {"phase": "Pending"}}


async def test_why_everywhere_reads_only_the_namespaces_of_pods_that_ask_for_devices(
        api: ApiServer, ca: CertificateAuthority, tmp_path: Path) -> None:
    """``why -A`` on a big cluster: a pod that asks for no device (no claims, no extended resource a
    DeviceClass serves) costs no request of its namespace, and the DeviceClasses are listed once."""
    from gpuslice.inspect.commands import _diagnose
    from gpuslice.settings import ClusterAccess

    limits = {"resources": {"limits": {"example.com/gpu": "1"}}}
    api.objects = {
        "/api/v1/pods": [
            _pending("a", "claims", resourceClaims=[{"name": "gpu", "resourceClaimTemplateName": "gpu"}]),
            _pending("b", "plain"),
            _pending("c", "extended", containers=[{"name": "main", **limits}]),
            _pending("d", "device-plugin", containers=[{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]),
            *(_pending(f"other-{n}", "plain") for n in range(10)),
        ],
        "/apis/resource.k8s.io/v1/deviceclasses": [
            {"metadata": {"name": "x"}, "spec": {"extendedResourceName": "example.com/gpu"}}],
    }
    path = two_contexts(tmp_path / "config", ca, api.port)
    await _diagnose(ClusterAccess(kubeconfig=path, context="prod"), None, None, True)
    read = {p.split("/")[4] for p in api.paths if p.startswith("/api/v1/namespaces/")} - {"gpuslice-system"}
    read |= {p.split("/")[5] for p in api.paths if p.startswith("/apis/resource.k8s.io/v1/namespaces/")}
    assert read == {"a", "c"}
    assert sum(p.startswith("/apis/resource.k8s.io/v1/deviceclasses") for p in api.paths) == 1


async def test_the_install_namespace_is_where_drain_lists_and_ledgers_are_read(
        api: ApiServer, ca: CertificateAuthority, tmp_path: Path) -> None:
    """gpuslice installed in gpu-ops: status, why and defrag read its drain lists and ledgers there
    (--gpuslice-namespace, or GPUSLICE_NAMESPACE as the processes read it), never in gpuslice-system;
    -n stays the namespace of the pods looked at, as in kubectl."""
    path = two_contexts(tmp_path / "config", ca, api.port)
    access = ["--context", "prod", "--kubeconfig", str(path)]
    drains = "/api/v1/namespaces/gpu-ops/configmaps?labelSelector="
    ledgers = "/apis/gpuslice.dev/v1alpha1/namespaces/gpu-ops/gpusliceledgers?labelSelector="
    rc, _, err = await run("status", "-o", "json", *access, "--gpuslice-namespace", "gpu-ops", home=tmp_path)
    assert rc == 0, err
    assert any(p.startswith(drains) for p in api.paths), api.paths
    rc, _, err = await run("why", "trainer", "-n", "team-b", "-o", "json", *access, home=tmp_path,
                           environ={"GPUSLICE_NAMESPACE": "gpu-ops"})
    assert rc == 1, err  # no such pod
    assert "/api/v1/namespaces/team-b/pods/trainer" in api.paths
    assert any(p.startswith(ledgers) for p in api.paths), api.paths
    rc, _, err = await run("defrag", "-o", "json", *access, "--gpuslice-namespace", "gpu-ops", home=tmp_path,
                           program="kubectl-gpuslice")
    assert rc == 0, err
    assert not [p for p in api.paths if "/namespaces/gpuslice-system/" in p]
    rc, _, err = await run("status", *access, "--gpuslice-namespace", "Not_A_Namespace", home=tmp_path)
    assert rc == 2
    assert "gpuslice-namespace" in err
