"""Everything the maxMemory webhook can be told (flags and ``GPUSLICE_*`` environment variables)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator

from gpuslice.dra.names import MEMORY_WEBHOOK_TLS
from gpuslice.settings import ProcessSettings


class WebhookSettings(ProcessSettings):
    port: int = Field(default=8443, ge=1, le=65535, description=(
        "Serve the webhook (HTTPS, /validate/maxmemory) on this port; the Service gpuslice-webhook sends 443 here."))
    address: str = Field(default="0.0.0.0", description=(
        "Listen on this address (the dev cluster's 127.0.0.1, where its API server calls it by URL)."))
    tls_secret: str = Field(default=MEMORY_WEBHOOK_TLS, description=(
        "The Secret in gpuslice's own namespace (the namespace setting) with tls.crt and tls.key to serve with,"
        " re-read every tls_interval seconds (the controller, or cert-manager, rotates it)."))
    tls_interval: float = Field(default=30.0, gt=0, description=(
        "Seconds between reads of the TLS Secret: a rotated certificate is served within this long."))
    client_ca_file: Path | None = Field(default=None, description=(
        "PEM bundle of the CAs that sign the client certificate the API server presents to this webhook (its"
        " --admission-control-config-file: docs/install.md). Set, every caller must present a certificate signed"
        " directly by one of them, or it is refused before its review is read; the file is read again every"
        " tls_interval seconds (a CA added is trusted, a CA taken out refused). Unset, anyone who reaches the port"
        " may send reviews (each still charged only for the claim as the API server holds it)."))
    client_allowed_names: tuple[str, ...] = Field(default=(), description=(
        "With client_ca_file: the common names a caller's certificate may have (repeat the flag; in the variable,"
        " separated by spaces), as kube-apiserver's --requestheader-allowed-names. Needed when that CA signs other"
        " certificates too (a cluster's own CA signs every kubelet's and admin's); empty: any certificate it"
        " signed."))
    charge_grace: float = Field(default=60.0, gt=0, description=(
        "Seconds a charge stands for a claim that holds no allocation (its allocation write may still be"
        " in flight) before it is released: how long an allocation write that failed after its charge"
        " keeps that memory counted. A retried allocation of the same claim reuses its charge, and a"
        " deleted claim's charge goes at once."))
    resync: float = Field(default=30.0, gt=0, description=(
        "Seconds between full passes over every ledger against the claims (a watch event starts one at"
        " once): the recalculation that releases what was charged for writes that never happened."))

    @model_validator(mode="after")
    def _names_need_a_ca(self) -> WebhookSettings:
        if self.client_allowed_names and self.client_ca_file is None:
            raise ValueError("--client-allowed-names needs --client-ca-file: the names of certificates signed by"
                             " which CA?")
        return self
