"""The maxMemory webhook's certificates are gpuslice's own: made by the controller, trusted by the
API server through the webhook configuration's caBundle, served by the webhook, and rotated,
serving certificate and CA alike, without a moment when the API server cannot call the webhook."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime

from gpuslice import certs
from gpuslice.controller.tenancy import memory_probe_claim
from gpuslice.controller.webhook_tls import TlsSettings, ensure_webhook_tls, service_hosts
from gpuslice.dra.names import MEMORY_PROBE_ANSWER, MEMORY_WEBHOOK_CA, MEMORY_WEBHOOK_TLS
from gpuslice.kube.client import KubeClient, KubeError
from tests.cluster.kubeutil import RESOURCE, wait_for
from tests.cluster.operator_fixtures import ControllerProcess, WebhookProcess

SECRETS = "/api/v1/namespaces/gpuslice-system/secrets"


async def answers(kube: KubeClient) -> str:
    """What the API server says when it calls the webhook with the controller's probe."""
    try:
        await kube.create(f"{RESOURCE}/namespaces/gpuslice-system/resourceclaims", memory_probe_claim(), dryRun="All")
    except KubeError as error:
        return error.message
    return "admitted without asking the webhook"


async def serving(kube: KubeClient) -> bytes:
    secret = await kube.get(f"{SECRETS}/{MEMORY_WEBHOOK_TLS}")
    return base64.b64decode(secret["data"]["tls.crt"])


async def test_the_webhook_keeps_answering_while_its_certificates_rotate(
    kube: KubeClient, controller: ControllerProcess, memory_webhook: WebhookProcess,
) -> None:
    """A CA of 60 s and serving certificates of 24 s, rotated by the controller's own pass (run here
    every 2 s, as its loop would run it, so the test need not wait a year): the API server reaches the
    webhook at every moment, through several serving certificates and at least one new CA."""
    assert MEMORY_PROBE_ANSWER in await answers(kube)  # the session's certificates, made by the controller
    short = TlsSettings(service_hosts("127.0.0.1"), datetime.timedelta(seconds=24), datetime.timedelta(seconds=60))
    for name in (MEMORY_WEBHOOK_CA, MEMORY_WEBHOOK_TLS):
        with contextlib.suppress(KubeError):
            await kube.delete(f"{SECRETS}/{name}")
    leaves, cas, refusals = set(), set(), []
    try:
        await ensure_webhook_tls(kube, short)
        await wait_for(lambda: _probe_ok(kube), within=30, what="the webhook to serve the new certificate")
        loop = asyncio.get_running_loop()
        started = loop.time()
        while loop.time() - started < 90:
            await ensure_webhook_tls(kube, short)
            leaf = await serving(kube)
            leaves.add(leaf)
            ca = base64.b64decode((await kube.get(f"{SECRETS}/{MEMORY_WEBHOOK_CA}"))["data"]["ca.crt"])
            cas.add(ca)
            assert certs.signed_by(leaf, ca) or len(cas) > 1
            said = await answers(kube)
            if MEMORY_PROBE_ANSWER not in said:
                refusals.append(said)
            await asyncio.sleep(2)  # length: between two passes of the rotation
    finally:
        # Back to long-lived certificates (what the session's controller makes). The short CA is
        # kept until a third of its life is left, and a serving certificate never outlives its CA,
        # so this takes passes until a new CA is trusted and a year-long certificate is served: the
        # session's controller passes only every 10 minutes, and later tests need the webhook.
        long = TlsSettings(service_hosts("127.0.0.1"), datetime.timedelta(days=365), datetime.timedelta(days=3650))

        async def long_lived() -> bool:
            await ensure_webhook_tls(kube, long)
            expires = certs.expires(await serving(kube))
            day = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=1)
            return expires is not None and expires > day and await _probe_ok(kube)

        await wait_for(long_lived, within=120, every=2, what="the webhook to serve a long-lived certificate")
    print(f"{len(leaves)} serving certificates and {len(cas)} CAs in 90 s; refusals: {refusals[:3]}")
    assert not refusals, f"the API server could not call the webhook during a rotation: {refusals[:3]}"
    assert len(leaves) >= 4, "the serving certificate was not rotated"
    assert len(cas) >= 2, "the CA was not rotated"


async def _probe_ok(kube: KubeClient) -> bool:
    return MEMORY_PROBE_ANSWER in await answers(kube)
