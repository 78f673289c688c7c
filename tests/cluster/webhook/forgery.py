"""A forger of the maxMemory webhook's reviews: what the API server would send for the scheduler's
allocation write, written by anyone, and posted with whatever client certificate the forger has
(none, the cluster admin's, one of its own CA, or the API server's own)."""

from __future__ import annotations

import base64
import ssl
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from gpuslice.devcluster.cluster import DevCluster
from gpuslice.devcluster.pki import WEBHOOK_CLIENT, CertificateAuthority, KeyPair
from gpuslice.dra.names import MEMORY_WEBHOOK_PATH


def forged_review(namespace: str, name: str, uid: str, klass: str, memory: str,
                  spec: dict[str, Any] | None = None, device: tuple[str, str] = ("any", "any")) -> dict[str, Any]:
    """An UPDATE of resourceclaims/status that allocates claim ``name`` one result of ``klass`` that
    consumed ``memory`` of ``device`` (pool, name) (``spec``: the claim's, when the forger copied it)."""
    spec = spec or {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": klass}}]}}
    return {
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()), "operation": "UPDATE", "namespace": namespace,
            "kind": {"group": "resource.k8s.io", "version": "v1", "kind": "ResourceClaim"},
            "resource": {"group": "resource.k8s.io", "version": "v1", "resource": "resourceclaims"},
            "subResource": "status", "name": name,
            "userInfo": {"username": "system:kube-scheduler"},
            "object": {
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": name, "namespace": namespace, "uid": uid},
                "spec": spec,
                "status": {"allocation": {"devices": {"results": [{
                    "request": "gpu", "driver": "gpu.gpuslice.dev", "pool": device[0], "device": device[1],
                    "consumedCapacity": {"memory": memory}}]}}},
            },
            "oldObject": {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                          "metadata": {"name": name, "namespace": namespace, "uid": uid}, "spec": spec},
        },
    }


def review_of(claim: dict[str, Any], memory: str, device: tuple[str, str] = ("any", "any")) -> dict[str, Any]:
    """A forged review of a real claim, its name, UID and spec copied (all readable with gpuslice-viewer,
    or by its own tenant), that says it consumed ``memory`` of ``device``."""
    meta = claim["metadata"]
    return forged_review(meta["namespace"], meta["name"], meta["uid"], "", memory, claim["spec"], device)


class Forger:
    """Posts reviews to a webhook on loopback, with the client certificate it was given (or none)."""

    def __init__(self, port: int, client: KeyPair | None, directory: Path) -> None:
        self.url = f"https://127.0.0.1:{port}{MEMORY_WEBHOOK_PATH}"
        self.context = ssl.create_default_context()
        self.context.check_hostname = False
        self.context.verify_mode = ssl.CERT_NONE  # the forger needs no trust in the webhook
        if client is not None:
            cert, key = client.write(directory, f"forger-{uuid.uuid4().hex[:6]}")
            self.context.load_cert_chain(cert, key)

    async def post(self, review: dict[str, Any]) -> dict[str, Any] | str:
        """The webhook's answer (its response), or what stopped the request (a refused handshake, a 403)."""
        try:
            async with aiohttp.ClientSession() as session, session.post(
                    self.url, json=review, ssl=self.context) as answer:
                if answer.status != 200:
                    return f"HTTP {answer.status}: {await answer.text()}"
                body: dict[str, Any] = await answer.json()
                return dict(body["response"])
        except (aiohttp.ClientError, ssl.SSLError, ConnectionError) as error:
            return f"{type(error).__name__}: {error}"


def _user_pair(kubeconfig: Path, user: str | None = None) -> KeyPair:
    config = yaml.safe_load(kubeconfig.read_text())
    [found] = [u["user"] for u in config["users"] if user is None or u["name"] == user]
    return KeyPair(base64.b64decode(found["client-certificate-data"]), base64.b64decode(found["client-key-data"]))


def admin_certificate(cluster: DevCluster) -> KeyPair:
    """The cluster admin's client certificate (system:masters): of the CA the webhook trusts, not its name."""
    return _user_pair(cluster.kubeconfig)


def api_server_certificate(cluster: DevCluster) -> KeyPair:
    """The certificate the API server presents to webhooks: a replay by whoever holds it."""
    return _user_pair(cluster.state.pki / "admission-webhooks.kubeconfig", "*")


def look_alike_certificate() -> KeyPair:
    """The API server's name, from a CA of the forger's own."""
    return CertificateAuthority.create("gpuslice-dev-cluster-ca").issue_client(WEBHOOK_CLIENT)
