"""Credentials read from kubeconfigs and the pod's ServiceAccount, without kubernetes_asyncio."""

from __future__ import annotations

import base64
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuslice.devcluster.pki import CertificateAuthority
from gpuslice.kube import transport


def _kubeconfig(path: Path, user: dict[str, object], cluster: dict[str, object] | None = None) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": cluster or {"server": "https://127.0.0.1:6443/"}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
    }))
    return path


def test_client_certificates_and_ca_from_data_or_files(tmp_path: Path) -> None:
    ca = CertificateAuthority.create()
    client = ca.issue_client("someone", ("group",))
    (tmp_path / "ca.crt").write_bytes(ca.pair.cert_pem)
    (tmp_path / "tls.key").write_bytes(client.key_pem)
    path = _kubeconfig(tmp_path / "config", {
        "client-certificate-data": base64.b64encode(client.cert_pem).decode(), "client-key": "tls.key",
    }, {"server": "https://127.0.0.1:6443/", "certificate-authority": "ca.crt"})
    found = transport.from_kubeconfig_file(path)
    assert found is not None
    assert (found.server, found.ca_pem, found.cert_pem, found.key_pem) == (
        "https://127.0.0.1:6443", ca.pair.cert_pem, client.cert_pem, client.key_pem)
    context = transport.ssl_context(found)  # the pair loads; no file of it is left behind
    assert context.verify_mode.name == "CERT_REQUIRED"


def test_tokens_and_token_files(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("t-from-file\n")
    found = transport.from_kubeconfig_file(_kubeconfig(tmp_path / "config", {"tokenFile": "token"}))
    assert found is not None
    assert found.token_file == tmp_path / "token"
    found = transport.from_kubeconfig_file(_kubeconfig(tmp_path / "config", {"token": "abc"}))
    assert found is not None
    assert found.token == "abc"


def test_plugins_are_left_to_kubernetes_asyncio(tmp_path: Path) -> None:
    path = _kubeconfig(tmp_path / "config", {"exec": {"command": "aws", "apiVersion": "client.authentication.k8s.io/v1"}})
    assert transport.from_kubeconfig_file(path) is None


def test_a_missing_context_is_named(tmp_path: Path) -> None:
    path = tmp_path / "config"
    path.write_text(yaml.safe_dump({"current-context": "nope", "contexts": []}))
    with pytest.raises(ValueError, match="no context named 'nope'"):
        transport.from_kubeconfig_file(path)


def test_the_agent_does_not_import_kubernetes_asyncio() -> None:
    """It is 60 MiB of generated models; the agent runs on every GPU node."""
    code = "import sys, gpuslice.agent.run; print('kubernetes_asyncio' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "False"


@pytest.mark.parametrize(("make", "words"), [
    (lambda p: p / "absent", "No such file or directory"),
    (lambda p: p, "Is a directory"),
    (lambda p: (p / "bad").write_text("{{{") and p / "bad", "kubeconfig"),
])
async def test_a_bad_kubeconfig_is_an_error_that_names_it(tmp_path: Path, make: Any, words: str) -> None:
    path = make(tmp_path)
    with pytest.raises(transport.KubeconfigError, match=words):
        await transport.connect(path)
