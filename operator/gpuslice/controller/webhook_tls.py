"""The maxMemory webhook's TLS: a CA and a serving certificate, made and rotated by the controller.

The controller is the one writer (it leads; the webhook's replicas only read), so a rotation
needs no coordination between copies:

- ``gpuslice-webhook-ca`` (read by the controller only): the CA's certificate and key, and the
  previous CA's certificate while certificates it signed may still be served;
- the ValidatingWebhookConfiguration's ``caBundle``: the current CA and the previous one;
- ``gpuslice-webhook-tls`` (what the webhook serves, and reloads when it changes): the serving
  certificate, its key, and the same bundle as ``ca.crt``.

A certificate is replaced once a third of its validity is left. A new CA goes into the bundle
first; the serving certificate is signed by it only on a later pass, once the API server was
given the bundle, so the webhook is never served with a certificate its callers do not trust.
With ``--webhook-certs external`` (cert-manager) the controller leaves all of this alone.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
from dataclasses import dataclass
from typing import Any

import structlog

from gpuslice import certs
from gpuslice.backoff import Backoff, spread
from gpuslice.coordinates import WEBHOOK_CONFIGURATIONS, secret_path, secrets_in, webhook_configuration_path
from gpuslice.dra.names import (
    CONTROLLER_NAMESPACE,
    MANAGED_BY,
    MEMORY_WEBHOOK_CA,
    MEMORY_WEBHOOK_CONFIG,
    MEMORY_WEBHOOK_SERVICE,
    MEMORY_WEBHOOK_TLS,
)
from gpuslice.kube.client import KubeClient, KubeError, NotFound
from gpuslice.kube.watch import watch

log = structlog.get_logger(__name__)
RENEW_AT = 1 / 3  # the part of its validity left when a certificate is replaced


@dataclass(frozen=True)
class TlsSettings:
    hosts: tuple[str, ...]  # the serving certificate's names: the Service's, and any extra
    cert_lifetime: datetime.timedelta
    ca_lifetime: datetime.timedelta
    home: str = CONTROLLER_NAMESPACE  # gpuslice's own namespace: the Secrets' and the Service's


def service_hosts(extra: str = "", home: str = CONTROLLER_NAMESPACE) -> tuple[str, ...]:
    """What the API server calls the webhook by: its Service's DNS names (in ``home``, gpuslice's own
    namespace), then ``extra`` (comma separated: the dev cluster's 127.0.0.1)."""
    service = f"{MEMORY_WEBHOOK_SERVICE}.{home}.svc"
    return (service, f"{service}.cluster.local", *[h.strip() for h in extra.split(",") if h.strip()])


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _field(secret: dict[str, Any] | None, key: str) -> bytes:
    value = ((secret or {}).get("data") or {}).get(key)
    return base64.b64decode(value) if value else b""


async def _secret(kube: KubeClient, name: str, home: str) -> dict[str, Any] | None:
    try:
        return await kube.get(secret_path(home, name))
    except NotFound:
        return None


async def _write_secret(kube: KubeClient, name: str, home: str, live: dict[str, Any] | None,
                        data: dict[str, bytes], kind: str = "Opaque") -> None:
    body: dict[str, Any] = {"apiVersion": "v1", "kind": "Secret", "type": kind,
                            "metadata": {"name": name, "namespace": home, "labels": dict(MANAGED_BY)},
                            "data": {k: _b64(v) for k, v in data.items()}}
    if live is None:
        await kube.create(secrets_in(home), body)
    else:  # optimistic concurrency: a conflict is tried again on the next pass
        body["metadata"]["resourceVersion"] = live["metadata"]["resourceVersion"]
        await kube.replace(secret_path(home, name), body)


async def _current_ca(kube: KubeClient, settings: TlsSettings, now: datetime.datetime) -> tuple[certs.Pem, bytes]:
    """The CA to sign with, and the bundle the API server must trust (rotating the CA if due)."""
    live = await _secret(kube, MEMORY_WEBHOOK_CA, settings.home)
    ca = certs.Pem(_field(live, "ca.crt"), _field(live, "ca.key"))
    previous = _field(live, "previous.crt")
    if previous and (certs.expires(previous) or now) <= now:
        previous = b""
    if not ca.cert or not ca.key or certs.lifetime_left(ca.cert, now) < RENEW_AT:
        if ca.cert and certs.lifetime_left(ca.cert, now) > 0:
            previous = ca.cert  # still trusted while certificates it signed are served
        ca = certs.new_ca("gpuslice-webhook-ca", settings.ca_lifetime, now)
        log.info("webhook CA made", rotated=bool(previous))
    elif previous == _field(live, "previous.crt"):
        return ca, ca.cert + previous
    await _write_secret(kube, MEMORY_WEBHOOK_CA, settings.home, live,
                        {"ca.crt": ca.cert, "ca.key": ca.key, "previous.crt": previous})
    return ca, ca.cert + previous


async def _trust(kube: KubeClient, bundle: bytes) -> bool | None:
    """Put ``bundle`` in every webhook of the configuration: True if it was there already, False if
    written now, None when the configuration is not installed."""
    try:
        config = await kube.get(webhook_configuration_path(MEMORY_WEBHOOK_CONFIG))
    except NotFound:
        return None
    wanted = _b64(bundle)
    patch: list[dict[str, Any]] = []
    for i, hook in enumerate(config.get("webhooks") or []):
        if (hook.get("clientConfig") or {}).get("caBundle") != wanted:
            patch += [{"op": "test", "path": f"/webhooks/{i}/name", "value": hook["name"]},
                      {"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": wanted}]
    if not patch:
        return True
    await kube.request("PATCH", webhook_configuration_path(MEMORY_WEBHOOK_CONFIG), patch,
                       content_type="application/json-patch+json")
    log.info("webhook caBundle written", config=MEMORY_WEBHOOK_CONFIG)
    return False


@dataclass(frozen=True)
class TlsPass:
    done: str  # what the pass did, for the log
    again_soon: bool = False  # a new CA the serving certificate must follow, or no configuration to trust it yet


async def ensure_webhook_tls(kube: KubeClient, settings: TlsSettings, now: datetime.datetime | None = None) -> TlsPass:
    """One pass: the CA, the bundle the API server trusts, the serving certificate."""
    now = now or datetime.datetime.now(datetime.UTC)
    ca, bundle = await _current_ca(kube, settings, now)
    trusted = await _trust(kube, bundle)
    live = await _secret(kube, MEMORY_WEBHOOK_TLS, settings.home)
    leaf = _field(live, "tls.crt")
    due = (not leaf or not certs.signed_by(leaf, ca.cert) or certs.lifetime_left(leaf, now) < RENEW_AT
           or certs.hosts_of(leaf) != set(settings.hosts))
    if due and leaf and trusted is False and not certs.signed_by(leaf, ca.cert):
        # The API server has just been given a new CA: sign with it on the next pass, not before.
        return TlsPass("new CA trusted; serving certificate follows", again_soon=True)
    if due:
        new = certs.issue_server(ca, settings.hosts, settings.cert_lifetime, now)
        await _write_secret(kube, MEMORY_WEBHOOK_TLS, settings.home, live,
                            {"tls.crt": new.cert, "tls.key": new.key, "ca.crt": bundle}, "kubernetes.io/tls")
        log.info("webhook serving certificate issued", hosts=list(settings.hosts), expires=str(certs.expires(new.cert)))
        return TlsPass("serving certificate issued", again_soon=trusted is None)
    if _field(live, "ca.crt") != bundle:
        await _write_secret(kube, MEMORY_WEBHOOK_TLS, settings.home, live,
                            {"tls.crt": leaf, "tls.key": _field(live, "tls.key"), "ca.crt": bundle},
                            "kubernetes.io/tls")
    if trusted is None:
        return TlsPass("current; no webhook configuration to trust it yet", again_soon=True)
    return TlsPass("current")


async def keep_webhook_tls(kube: KubeClient, settings: TlsSettings, stop: asyncio.Event, interval: float,
                           changed: asyncio.Event | None = None) -> None:
    """``ensure_webhook_tls`` every ``interval`` seconds (sooner right after a new CA), until ``stop``,
    and at once when ``changed`` is set (``watch_webhook_config``: the configuration was created, or
    edited, e.g. re-applied without its caBundle); a pass that fails is tried again after 2 s
    doubling to ``interval``, with jitter. While there is no webhook configuration to trust the CA
    (installed later, or not at all: a cluster without the maxMemory webhook), it looks again after
    10 s doubling to ``interval``: three reads every 10 s, for good, were most of the requests of a
    controller with nothing to do; the watch, not the looks, finds a configuration created later."""
    backoff, soon = Backoff(2.0, interval), Backoff(min(interval, 10.0), interval)
    while not stop.is_set():
        if changed is not None:
            changed.clear()
        try:
            done = await ensure_webhook_tls(kube, settings)
            # Soon again after a new CA (the serving certificate follows), or while there is no
            # webhook configuration to give the CA to (installed after the controller started).
            if done.again_soon:
                wait = soon.next()
            else:
                wait = spread(interval)
                soon.reset()
            backoff.reset()
        except KubeError as error:
            wait = backoff.next()
            log.warning("webhook certificates could not be kept; trying again", error=str(error),
                        retry_in=round(wait, 1))
        try:
            await asyncio.wait_for(_either(stop, changed), timeout=wait)
        except TimeoutError:
            continue


async def _either(stop: asyncio.Event, changed: asyncio.Event | None) -> None:
    waits = [asyncio.ensure_future(e.wait()) for e in (stop, changed) if e is not None]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiting in waits:
            waiting.cancel()


async def watch_webhook_config(kube: KubeClient, stop: asyncio.Event, changed: asyncio.Event) -> None:
    """Set ``changed`` when the maxMemory webhook's configuration (a watch of it alone, by name) is
    created, or changed to a webhook without a caBundle (re-applied from its manifest), so that the
    keeper's pass follows at once, not after its interval (up to ``--webhook-cert-interval``: the API
    server cannot call the webhook meanwhile). A caBundle that changed is the keeper's own doing (or
    cert-manager's, or an admin's on purpose): it does not wake the keeper."""

    def handler(kind: str | None, body: dict[str, Any]) -> None:
        bare = any(not (hook.get("clientConfig") or {}).get("caBundle") for hook in body.get("webhooks") or [])
        if kind == "ADDED" or (kind == "MODIFIED" and bare):
            changed.set()

    def on_error(error: BaseException) -> None:
        log.debug("the maxMemory webhook configuration's watch failed; it is opened again", error=str(error))

    await watch(kube, WEBHOOK_CONFIGURATIONS, handler, stop,
                query={"fieldSelector": f"metadata.name={MEMORY_WEBHOOK_CONFIG}"}, on_error=on_error)
