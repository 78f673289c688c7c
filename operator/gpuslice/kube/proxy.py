"""Which proxy a request to the API server goes through, as client-go decides it.

A kubeconfig's ``proxy-url`` is used for every request. Without one, the environment is read as
Go's ``http.ProxyFromEnvironment`` reads it (golang.org/x/net/http/httpproxy), which is not how
Python's urllib or aiohttp's ``trust_env`` read it: ``HTTPS_PROXY`` (or ``https_proxy``) for https
servers, ``HTTP_PROXY`` for http ones; never for ``localhost`` or a loopback address; and
``NO_PROXY`` entries may be ``*``, an IP address, a CIDR range, or a domain (``example.com``
matches it and its subdomains, ``.example.com`` only the subdomains), each with an optional port.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from urllib.parse import urlsplit

from gpuslice.kube.credentials import KubeconfigError

DEFAULT_PORTS = {"http": "80", "https": "443"}
PROXY_SCHEMES = ("http", "https")


def supported(proxy: str, where: str, fix: str) -> str:
    """``proxy`` if gpuslice's client can go through it, else a KubeconfigError that says so."""
    parts = urlsplit(proxy)
    if parts.scheme.lower() not in PROXY_SCHEMES or not parts.hostname:
        raise KubeconfigError(f"{where} {proxy!r}: gpuslice's client goes through http:// and https:// proxies"
                              f" only (kubectl also speaks socks5); {fix}")
    return proxy


def _env(environ: Mapping[str, str], name: str) -> str:
    return environ.get(name) or environ.get(name.lower()) or ""


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def _split(entry: str) -> tuple[str, str]:
    """host and port of a NO_PROXY entry (``[::1]:80``, ``host:80``, ``host``, ``::1``)."""
    if entry.startswith("["):
        host, _, rest = entry[1:].partition("]")
        return host, rest.removeprefix(":")
    if entry.count(":") == 1:
        host, _, port = entry.partition(":")
        return host, port
    return entry, ""


def _bypassed(host: str, port: str, no_proxy: str) -> bool:
    ip = _ip(host)
    for raw in no_proxy.split(","):
        entry = raw.strip().lower()
        if not entry:
            continue
        if entry == "*":
            return True
        if "/" in entry:
            try:
                if ip is not None and ip in ipaddress.ip_network(entry, strict=False):
                    return True
            except ValueError:
                pass
            continue
        name, want = _split(entry)
        if want and want != port:
            continue
        if _ip(name) is not None:
            if ip is not None and ip == _ip(name):
                return True
            continue
        if ip is not None:
            continue
        name = name.removeprefix("*")
        if name.startswith("."):
            if host.endswith(name):
                return True
        elif host == name or host.endswith("." + name):
            return True
    return False


def proxy_for(url: str, proxy_url: str | None, environ: Mapping[str, str]) -> str | None:
    """The proxy for requests to ``url`` (the API server), or None to connect directly."""
    if proxy_url:
        return proxy_url
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme == "https":
        proxy = _env(environ, "HTTPS_PROXY")
    elif scheme == "http" and not environ.get("REQUEST_METHOD"):  # Go ignores HTTP_PROXY in a CGI program
        proxy = _env(environ, "HTTP_PROXY")
    else:
        proxy = ""
    host = (parts.hostname or "").lower()
    if not proxy or not host or host == "localhost":
        return None
    ip = _ip(host)
    if ip is not None and ip.is_loopback:
        return None
    if _bypassed(host, str(parts.port or DEFAULT_PORTS.get(scheme, "")), _env(environ, "NO_PROXY")):
        return None
    return supported(proxy if "://" in proxy else f"http://{proxy}", "$HTTPS_PROXY or $HTTP_PROXY",
                     "use an HTTP proxy, or exempt the API server in $NO_PROXY")
