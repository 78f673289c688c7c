"""The proxy choice of Go's http.ProxyFromEnvironment (golang.org/x/net/http/httpproxy), case by case."""

from __future__ import annotations

import pytest

from gpuslice.kube.credentials import KubeconfigError
from gpuslice.kube.proxy import proxy_for

P = "http://proxy:3128"


@pytest.mark.parametrize(("url", "environ", "expected"), [
    ("https://api.example:6443", {"HTTPS_PROXY": P}, P),
    ("https://api.example:6443", {"https_proxy": P}, P),
    ("https://api.example:6443", {"HTTPS_PROXY": "proxy:3128"}, P),  # no scheme: http://
    ("https://api.example:6443", {"HTTP_PROXY": P}, None),  # HTTP_PROXY is for http:// servers
    ("http://api.example", {"HTTP_PROXY": P}, P),
    ("http://api.example", {"HTTP_PROXY": P, "REQUEST_METHOD": "GET"}, None),  # a CGI program
    ("https://localhost:6443", {"HTTPS_PROXY": P}, None),
    ("https://127.0.0.1:6443", {"HTTPS_PROXY": P}, None),
    ("https://[::1]:6443", {"HTTPS_PROXY": P}, None),
    ("https://api.example:6443", {"HTTPS_PROXY": P, "NO_PROXY": "*"}, None),
    ("https://api.example:6443", {"HTTPS_PROXY": P, "NO_PROXY": "api.example"}, None),
    ("https://a.api.example:6443", {"HTTPS_PROXY": P, "NO_PROXY": "api.example"}, None),
    ("https://api.example:6443", {"HTTPS_PROXY": P, "NO_PROXY": ".api.example"}, P),  # subdomains only
    ("https://a.api.example:6443", {"HTTPS_PROXY": P, "no_proxy": "*.api.example"}, None),
    ("https://xapi.example:6443", {"HTTPS_PROXY": P, "NO_PROXY": "api.example"}, P),
    ("https://api.example:6443", {"HTTPS_PROXY": P, "NO_PROXY": "api.example:443"}, P),  # another port
    ("https://api.example:6443", {"HTTPS_PROXY": P, "NO_PROXY": "api.example:6443"}, None),
    ("https://api.example", {"HTTPS_PROXY": P, "NO_PROXY": "api.example:443"}, None),  # the scheme's port
    ("https://10.96.0.1:443", {"HTTPS_PROXY": P, "NO_PROXY": "10.0.0.0/8"}, None),
    ("https://10.96.0.1:443", {"HTTPS_PROXY": P, "NO_PROXY": "10.96.0.1"}, None),
    ("https://10.96.0.1:443", {"HTTPS_PROXY": P, "NO_PROXY": "192.168.0.0/16,10.96.0.2"}, P),
    ("https://[fd00::1]:443", {"HTTPS_PROXY": P, "NO_PROXY": "fd00::/8"}, None),
    ("https://api.example:6443", {"HTTPS_PROXY": P, "NO_PROXY": "10.0.0.0/8"}, P),  # CIDR: addresses only
])
def test_proxy_from_the_environment(url: str, environ: dict[str, str], expected: str | None) -> None:
    assert proxy_for(url, None, environ) == expected


def test_the_kubeconfigs_proxy_wins_everywhere() -> None:
    assert proxy_for("https://127.0.0.1:6443", "http://corp:8080", {"NO_PROXY": "*"}) == "http://corp:8080"


def test_a_socks_proxy_is_refused_by_name() -> None:
    with pytest.raises(KubeconfigError, match=r"socks5://s:1080.*http:// and https:// proxies only"):
        proxy_for("https://api.example", None, {"HTTPS_PROXY": "socks5://s:1080"})
