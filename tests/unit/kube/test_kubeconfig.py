"""Kubeconfigs read as kubectl reads them: which files in which order, how several merge, which
context, which namespace, and every field honoured or refused by name."""

from __future__ import annotations

import base64
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuslice.devcluster.pki import CertificateAuthority
from gpuslice.kube import kubeconfig
from gpuslice.kube.credentials import Impersonation, KubeconfigError
from gpuslice.kube.kubeconfig import resolve
from gpuslice.kube.tls import ssl_context
from tests.unit.kube.loopback import kubeconfig as write


def simple(path: Path, server: str = "https://one.example:6443", *, namespace: str | None = None,
           user: dict[str, Any] | None = None, cluster: dict[str, Any] | None = None,
           name: str = "one") -> Path:
    context: dict[str, Any] = {"cluster": name, "user": name}
    if namespace:
        context["namespace"] = namespace
    return write(path, contexts={name: context}, clusters={name: {"server": server, **(cluster or {})}},
                 users={name: user or {"token": f"{name}-token"}}, current=name)


@pytest.fixture
def pod(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """The environment and ServiceAccount directory of a pod."""
    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "token").write_text("pod-token\n")
    (account / "ca.crt").write_bytes(CertificateAuthority.create().pair.cert_pem)
    (account / "namespace").write_text("gpuslice-system\n")
    return {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}, account


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty home directory: ~/.kube/config is what a test writes there."""
    directory = tmp_path / "home"
    (directory / ".kube").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(directory))
    return directory


# --- precedence: --kubeconfig, then $KUBECONFIG, then ~/.kube/config, then the pod -------------

def test_the_flag_wins_over_everything(tmp_path: Path, home: Path, pod: tuple[dict[str, str], Path]) -> None:
    environ, account = pod
    flag = simple(tmp_path / "flag", "https://flag.example")
    simple(home / ".kube" / "config", "https://home.example")
    env = simple(tmp_path / "env", "https://env.example")
    for pod_first in (False, True):
        found = resolve(flag, environ={**environ, "KUBECONFIG": str(env)}, account=account, pod_first=pod_first)
        assert found.server == "https://flag.example"


def test_kubeconfig_variable_then_home_then_the_pod(tmp_path: Path, home: Path,
                                                     pod: tuple[dict[str, str], Path]) -> None:
    environ, account = pod
    env = simple(tmp_path / "env", "https://env.example")
    assert resolve(environ={**environ, "KUBECONFIG": str(env)}, account=account).server == "https://env.example"
    assert resolve(environ=environ, account=account).source.startswith("the pod's ServiceAccount")
    simple(home / ".kube" / "config", "https://home.example")
    assert resolve(environ=environ, account=account).server == "https://home.example"
    assert resolve(environ={**environ, "KUBECONFIG": str(env)}, account=account).server == "https://env.example"


def test_the_pod_last_for_the_cli_and_first_for_the_controller_and_agent(
        tmp_path: Path, home: Path, pod: tuple[dict[str, str], Path]) -> None:
    environ, account = pod
    simple(home / ".kube" / "config", "https://home.example")
    assert resolve(environ=environ, account=account).server == "https://home.example"
    found = resolve(environ=environ, account=account, pod_first=True)
    assert (found.server, found.namespace, found.token_file) == (
        "https://10.96.0.1:443", "gpuslice-system", account / "token")
    # --context names a kubeconfig context, so even the runtime reads the kubeconfig then
    assert resolve(context="one", environ=environ, account=account, pod_first=True).server == "https://home.example"


def test_nothing_found_says_so_in_gpuslices_words(tmp_path: Path, home: Path) -> None:
    with pytest.raises(KubeconfigError) as caught:
        resolve(environ={}, account=tmp_path / "no-account")
    assert str(caught.value).startswith("no kubeconfig found (~/.kube/config: no such file) and not in a pod (no"
                                        f" ServiceAccount token in {tmp_path / 'no-account'})")
    missing = tmp_path / "a" / "b"
    with pytest.raises(KubeconfigError, match=r"no kubeconfig found \(\$KUBECONFIG"):
        resolve(environ={"KUBECONFIG": f"{missing}:{tmp_path / 'c'}"}, account=tmp_path / "no-account")
    with pytest.raises(KubeconfigError, match=r"given with --kubeconfig.* does not exist"):
        resolve(missing, environ={}, account=tmp_path / "no-account")


def test_an_empty_kubeconfig_falls_back_to_the_pod(tmp_path: Path, home: Path,
                                                    pod: tuple[dict[str, str], Path]) -> None:
    environ, account = pod
    (home / ".kube" / "config").write_text("")
    assert resolve(environ=environ, account=account).server == "https://10.96.0.1:443"


def test_the_pods_namespace_variable_wins_over_its_file(pod: tuple[dict[str, str], Path]) -> None:
    environ, account = pod
    assert kubeconfig.in_cluster({**environ, "POD_NAMESPACE": "elsewhere"}, account) is not None
    assert kubeconfig.in_cluster({**environ, "POD_NAMESPACE": "elsewhere"}, account).namespace == "elsewhere"  # type: ignore[union-attr]
    (account / "namespace").unlink()
    assert kubeconfig.in_cluster(environ, account).namespace == "default"  # type: ignore[union-attr]
    assert kubeconfig.in_cluster({**environ, "KUBERNETES_SERVICE_HOST": "fd00::1"}, account).server == (  # type: ignore[union-attr]
        "https://[fd00::1]:443")


def test_a_pod_without_its_ca_says_so(pod: tuple[dict[str, str], Path]) -> None:
    """Not "kubeconfig $KUBECONFIG: No such file", which sent people looking for a kubeconfig."""
    environ, account = pod
    (account / "ca.crt").unlink()
    with pytest.raises(KubeconfigError, match=rf"the pod's ServiceAccount \({account}\): ca\.crt: No such file"):
        resolve(environ=environ, account=account, pod_first=True)


# --- several files merged as clientcmd merges them ------------------------------------------------

def test_several_files_merge_first_one_wins(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    ca = CertificateAuthority.create()
    (tmp_path / "b" / "ca.crt").write_bytes(ca.pair.cert_pem)
    (tmp_path / "b" / "token").write_text("from-b\n")
    first = write(tmp_path / "a" / "config", current="shared",
                  contexts={"shared": {"cluster": "shared", "user": "b-user", "namespace": "from-a"}},
                  clusters={"shared": {"server": "https://a.example"}}, users={})
    second = write(tmp_path / "b" / "config", current="only-b",
                   contexts={"shared": {"cluster": "shared", "user": "b-user", "namespace": "from-b"},
                             "only-b": {"cluster": "b", "user": "b-user"}},
                   clusters={"shared": {"server": "https://b.example"},
                             "b": {"server": "https://b-only.example", "certificate-authority": "ca.crt"}},
                   users={"b-user": {"tokenFile": "token"}})
    environ = {"KUBECONFIG": f"{first}:{tmp_path / 'missing'}:{second}"}
    found = resolve(environ=environ)
    # a's current-context; its own context and cluster; the user only b names, its file beside b
    assert (found.server, found.namespace, found.token_file) == (
        "https://a.example", "from-a", tmp_path / "b" / "token")
    other = resolve(context="only-b", environ=environ)
    assert (other.server, other.ca_pem, other.namespace) == ("https://b-only.example", ca.pair.cert_pem, "default")
    # the first file to set current-context wins, even one that defines nothing else
    write(tmp_path / "pick", current="only-b", contexts={}, clusters={}, users={})
    assert resolve(environ={"KUBECONFIG": f"{tmp_path / 'pick'}:{first}:{second}"}).server == "https://b-only.example"


# --- the context and its namespace ------------------------------------------------------------------

def test_context_flag_and_the_contexts_namespace(tmp_path: Path) -> None:
    path = write(tmp_path / "config", current="prod",
                 contexts={"prod": {"cluster": "prod", "user": "me"},
                           "staging": {"cluster": "staging", "user": "me", "namespace": "team-a"}},
                 clusters={"prod": {"server": "https://prod.example"}, "staging": {"server": "https://stg.example/"}},
                 users={"me": {"token": "t"}})
    assert (resolve(path).server, resolve(path).namespace) == ("https://prod.example", "default")
    staging = resolve(path, "staging")
    assert (staging.server, staging.namespace, staging.token) == ("https://stg.example", "team-a", "t")
    with pytest.raises(KubeconfigError, match=r"has no context 'nope' \(it has: prod, staging\)"):
        resolve(path, "nope")


def test_no_current_context_asks_for_one(tmp_path: Path) -> None:
    path = write(tmp_path / "config", contexts={"x": {"cluster": "x"}}, clusters={"x": {"server": "https://x"}},
                 users={})
    with pytest.raises(KubeconfigError, match=r"sets no current-context: choose one with --context \(x\)"):
        resolve(path)
    assert resolve(path, "x").token is None  # a context without a user: anonymous, as kubectl


# --- fields: honoured, or refused by name --------------------------------------------------------------

def test_client_certificates_and_ca_from_data_or_files(tmp_path: Path) -> None:
    ca = CertificateAuthority.create()
    client = ca.issue_client("someone", ("group",))
    (tmp_path / "ca.crt").write_bytes(ca.pair.cert_pem)
    (tmp_path / "tls.key").write_bytes(client.key_pem)
    found = resolve(simple(tmp_path / "config", "https://127.0.0.1:6443/", cluster={"certificate-authority": "ca.crt"},
                           user={"client-certificate-data": base64.b64encode(client.cert_pem).decode(),
                                 "client-key": "tls.key"}))
    assert (found.server, found.ca_pem, found.cert_pem, found.key_pem) == (
        "https://127.0.0.1:6443", ca.pair.cert_pem, client.cert_pem, client.key_pem)
    context = ssl_context(found)  # the pair loads; no file of it is left behind
    assert context.verify_mode.name == "CERT_REQUIRED"


def _encrypted(pem: bytes) -> bytes:
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key(pem, None)
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.BestAvailableEncryption(b"pass-phrase"))


def _der(pem: bytes) -> bytes:
    import ssl

    return ssl.PEM_cert_to_DER_cert(pem.decode())


@pytest.mark.parametrize(("cluster", "user", "words"), [
    # kubectl reads PEM only; the ssl module took DER for a str and failed with UnicodeDecodeError
    (lambda ca, d: {"certificate-authority-data": base64.b64encode(_der(ca.pair.cert_pem)).decode()}, None,
     r"cluster 'one' in .*: certificate-authority-data: not PEM"),
    (lambda ca, d: {"certificate-authority": str(d / "der.crt")}, None,
     r"cluster 'one' in .*: certificate-authority .*der\.crt: not PEM"),
    (lambda ca, d: {"certificate-authority-data": base64.b64encode(b"-----BEGIN CERTIFICATE-----\nAAAA\n"
                                                                   b"-----END CERTIFICATE-----\n").decode()}, None,
     r"certificate-authority-data: no certificate authority could be read from it"),
    (None, lambda client, d: {"client-certificate-data": base64.b64encode(client.cert_pem).decode(),
                              "client-key": str(d / "encrypted.key")},
     r"user 'one' in .*: client-certificate-data and client-key .*encrypted\.key: the key is encrypted with a"
     " pass-phrase"),
    (None, lambda client, d: {"client-certificate-data": base64.b64encode(client.cert_pem).decode(),
                              "client-key-data": base64.b64encode(CertificateAuthority.create().pair.key_pem).decode()},
     r"user 'one' in .*: client-certificate-data and client-key-data: the client certificate and key could not be"
     " loaded"),
])
def test_bad_tls_material_is_named_with_its_field_and_file(tmp_path: Path, cluster: Any, user: Any,
                                                            words: str) -> None:
    """Refused while the kubeconfig is read, so ``gpuslice controller`` says so and exits rather
    than print an ssl traceback, and OpenSSL never asks for a pass-phrase on the terminal."""
    ca = CertificateAuthority.create()
    client = ca.issue_client("someone")
    (tmp_path / "der.crt").write_bytes(_der(ca.pair.cert_pem))
    (tmp_path / "encrypted.key").write_bytes(_encrypted(client.key_pem))
    path = simple(tmp_path / "config", cluster=cluster(ca, tmp_path) if cluster else None,
                  user=user(client, tmp_path) if user else None)
    with pytest.raises(KubeconfigError, match=words):
        resolve(path)


def test_base64_data_may_be_wrapped_as_go_reads_it(tmp_path: Path) -> None:
    """Go's base64 decoder skips line breaks (a CA pasted as wrapped lines) but nothing else."""
    ca = CertificateAuthority.create()
    data = base64.b64encode(ca.pair.cert_pem).decode()
    wrapped = "\r\n".join(data[i:i + 64] for i in range(0, len(data), 64)) + "\n"
    assert resolve(simple(tmp_path / "config", cluster={"certificate-authority-data": wrapped})).ca_pem == (
        ca.pair.cert_pem)
    with pytest.raises(KubeconfigError, match="certificate-authority-data is not base64"):
        resolve(simple(tmp_path / "config", cluster={"certificate-authority-data": data[:40] + " " + data[40:]}))


def test_a_server_without_a_scheme_gets_client_gos(tmp_path: Path) -> None:
    """client-go's DefaultServerURL: https:// when there is TLS to do (a CA, a client certificate,
    insecure-skip-tls-verify), else http://; "127.0.0.1:6443" was sent as a relative URL."""
    ca = CertificateAuthority.create()
    client = ca.issue_client("someone")
    data = base64.b64encode(ca.pair.cert_pem).decode()
    pair = {"client-certificate-data": base64.b64encode(client.cert_pem).decode(),
            "client-key-data": base64.b64encode(client.key_pem).decode()}
    for server, cluster, user, url in [
        ("127.0.0.1:6443", {"certificate-authority-data": data}, None, "https://127.0.0.1:6443"),
        ("localhost:6443", {"insecure-skip-tls-verify": True}, None, "https://localhost:6443"),
        ("api.example:6443", {}, pair, "https://api.example:6443"),
        ("localhost:8080", {}, None, "http://localhost:8080"),
        ("https://api.example/prefix", {}, None, "https://api.example/prefix"),
    ]:
        assert resolve(simple(tmp_path / "config", server, cluster=cluster, user=user)).server == url
    for server, words in [("127.0.0.1:6443/prefix", "must be a URL or a host:port pair"),
                          ("ftp://api.example", "must be https:// or http://")]:
        with pytest.raises(KubeconfigError, match=f"cluster 'one' in .*: server '{server}' {words}"):
            resolve(simple(tmp_path / "config", server))


def test_every_supported_field_is_read(tmp_path: Path) -> None:
    found = resolve(simple(tmp_path / "config", cluster={
        "tls-server-name": "api.internal", "proxy-url": "http://proxy:3128", "disable-compression": True,
        "extensions": [{"name": "client.authentication.k8s.io/exec", "extension": {"audience": "x"}}],
    }, user={"token": "t", "as": "jane", "as-uid": "42", "as-groups": ["dev", "ops"],
             "as-user-extra": {"scopes": ["a", "b"]}}))
    assert (found.tls_server_name, found.proxy_url, found.disable_compression, found.cluster_extension) == (
        "api.internal", "http://proxy:3128", True, {"audience": "x"})
    assert found.impersonate == Impersonation("jane", "42", ("dev", "ops"), (("scopes", ("a", "b")),))


@pytest.mark.parametrize(("cluster", "user", "context", "words"), [
    ({"certificate-authority-file": "x"}, {}, {}, "cluster 'one' in .*: certificate-authority-file is not supported"),
    ({}, {"as-user": "x"}, {}, "user 'one' in .*: as-user is not supported"),
    ({}, {}, {"namespaces": "x"}, "context 'one' in .*: namespaces is not supported"),
    ({}, {"exec": {"command": "x", "apiVersion": "client.authentication.k8s.io/v1", "interactiveMode": "Never",
                   "pluginPolicy": {}}}, {}, r"user 'one' in .*\.exec: pluginPolicy is not supported"),
    ({"proxy-url": "socks5://127.0.0.1:1080"}, {}, {}, "proxy-url 'socks5://127.0.0.1:1080': gpuslice's client goes"
                                                       " through http:// and https:// proxies only"),
    ({}, {"as-groups": ["x"]}, {}, "as-uid, as-groups or as-user-extra without as"),
    ({}, {"auth-provider": {"name": "gcp"}}, {}, "the gcp auth-provider was removed from kubectl and client-go; use"
                                                 ' the "gke-gcloud-auth-plugin"'),
    ({}, {"auth-provider": {"name": "azure"}}, {}, "azure auth-provider was removed"),
    ({}, {"token": "t", "username": "u", "password": "p"}, {}, "a token and a username or password are both set"),
    ({}, {"tokenFile": "t", "username": "u"}, {}, "a token and a username or password are both set"),
    ({}, {"auth-provider": {"name": "oidc"}, "exec": {"command": "x", "apiVersion": "client.authentication.k8s.io/v1",
                                                     "interactiveMode": "Never"}}, {},
     "exec and auth-provider are both set"),
    ({}, {"exec": {"command": "x", "apiVersion": "client.authentication.k8s.io/v1"}}, {},
     "interactiveMode '': use Never, IfAvailable or Always"),
    ({}, {"exec": {"command": "x", "apiVersion": "client.authentication.k8s.io/v1alpha1"}}, {},
     "v1alpha1 was removed"),
    ({"insecure-skip-tls-verify": True, "certificate-authority-data": "eA=="}, {}, {},
     "insecure-skip-tls-verify with a certificate authority"),
    ({}, {"client-certificate-data": "eA=="}, {}, "a client certificate needs its key"),
])
def test_what_gpuslice_does_not_do_is_refused_by_name(tmp_path: Path, cluster: dict[str, Any], user: dict[str, Any],
                                                       context: dict[str, Any], words: str) -> None:
    path = write(tmp_path / "config", current="one", contexts={"one": {"cluster": "one", "user": "one", **context}},
                 clusters={"one": {"server": "https://x.example", **cluster}}, users={"one": user})
    with pytest.raises(KubeconfigError, match=words):
        resolve(path)


EXEC = {"command": "x", "apiVersion": "client.authentication.k8s.io/v1", "interactiveMode": "Never"}


@pytest.mark.parametrize(("cluster", "user", "words"), [
    # A quoted "false" is a string: read as a truth value it would turn TLS verification off.
    ({"insecure-skip-tls-verify": "false"}, {}, "insecure-skip-tls-verify must be true or false, not 'false'"),
    ({"insecure-skip-tls-verify": 0}, {}, "insecure-skip-tls-verify must be true or false, not 0"),
    ({"disable-compression": "no"}, {}, "disable-compression must be true or false"),
    ({"server": 6443}, {}, "server must be a string, not 6443"),
    ({"tls-server-name": ["a"]}, {}, "tls-server-name must be a string"),
    ({}, {"exec": {**EXEC, "provideClusterInfo": "false"}}, r"exec\.provideClusterInfo must be true or false"),
    ({}, {"as": "jane", "as-groups": "admins"}, "as-groups must be a list of strings, not 'admins'"),
    ({}, {"as": "jane", "as-groups": ["a", 1]}, "as-groups must be a list of strings"),
    ({}, {"as": "jane", "as-user-extra": {"scopes": "view"}}, "as-user-extra must be a mapping of each key to a list of strings"),
    ({}, {"as": "jane", "as-user-extra": ["scopes"]}, "as-user-extra must be a mapping of each key to a list of strings"),
    ({}, {"exec": {**EXEC, "args": "--profile dev"}}, r"exec\.args must be a list of strings, not '--profile dev'"),
    ({}, {"exec": {**EXEC, "env": {"AWS_PROFILE": "dev"}}}, r"exec\.env must be a list of name and value"),
    ({}, {"exec": {**EXEC, "env": [{"name": "N", "value": 1}]}}, r"exec\.env\[0\]\.value must be a string"),
    ({}, {"exec": {**EXEC, "command": ["aws", "eks"]}}, r"exec\.command must be a string"),
    ({}, {"token": 12345}, "token must be a string, not 12345"),
    ({}, {"as": True}, "as must be a string"),
    ({}, {"auth-provider": {"name": "oidc", "config": ["id-token"]}}, "auth-provider.config must be a mapping of names to strings"),
])
def test_a_field_of_the_wrong_type_is_refused_by_name(tmp_path: Path, cluster: dict[str, Any], user: dict[str, Any],
                                                      words: str) -> None:
    """kubectl decodes a kubeconfig into typed fields and refuses a string where a bool or a list
    belongs; read loosely, a quoted "false" would turn TLS verification off."""
    path = write(tmp_path / "config", current="one", contexts={"one": {"cluster": "one", "user": "one"}},
                 clusters={"one": {"server": "https://x.example", **cluster}}, users={"one": user})
    with pytest.raises(KubeconfigError, match=f"(cluster|user) 'one' in {tmp_path / 'config'}.*{words}"):
        resolve(path)


def test_real_booleans_and_lists_are_read(tmp_path: Path) -> None:
    found = resolve(simple(tmp_path / "config", cluster={"insecure-skip-tls-verify": False,
                                                         "disable-compression": False},
                           user={"token": "t", "as": "jane", "as-groups": []}))
    assert (found.insecure, found.disable_compression, found.impersonate) == (False, False, Impersonation("jane"))
    assert resolve(simple(tmp_path / "config", cluster={"insecure-skip-tls-verify": True})).insecure is True


def test_only_the_chosen_contexts_fields_are_judged(tmp_path: Path) -> None:
    path = write(tmp_path / "config", current="good",
                 contexts={"good": {"cluster": "good", "user": "good"}, "odd": {"cluster": "odd", "user": "odd"}},
                 clusters={"good": {"server": "https://good"}, "odd": {"server": "https://odd", "newer-field": 1}},
                 users={"good": {"token": "t"}, "odd": {"auth-provider": {"name": "gcp"}}})
    assert resolve(path).server == "https://good"


def test_tokens_and_token_files(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("t-from-file\n")
    found = resolve(simple(tmp_path / "config", user={"tokenFile": "token"}))
    assert found.token_file == tmp_path / "token"
    assert resolve(simple(tmp_path / "config", user={"token": "abc"})).token == "abc"


@pytest.mark.parametrize(("make", "words"), [
    (lambda p: p / "absent", "does not exist"),
    (lambda p: p, "Is a directory"),
    (lambda p: (p / "bad").write_text("{{{") and p / "bad", "is not YAML"),
    (lambda p: (p / "list").write_text("[1, 2]") and p / "list", "is not a kubeconfig"),
])
def test_a_bad_kubeconfig_is_an_error_that_names_it(tmp_path: Path, make: Any, words: str) -> None:
    with pytest.raises(KubeconfigError, match=words):
        resolve(make(tmp_path))


def test_the_agent_does_not_import_kubernetes_asyncio() -> None:
    """It costs 36 MiB and half a second; the agent runs on every GPU node."""
    code = "import sys, gpuslice.agent.run, gpuslice.kube.transport; print('kubernetes_asyncio' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "False"


def test_an_encrypted_key_never_makes_openssl_ask_for_a_pass_phrase(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the PEM markers (a format they miss), OpenSSL's own prompt is answered by a callback that
    refuses: a controller must not block on a terminal, nor a person be asked by surprise."""
    from gpuslice.kube import tls
    from gpuslice.kube.credentials import Credentials

    monkeypatch.setattr(tls, "ENCRYPTED", ())
    client = CertificateAuthority.create().issue_client("someone")
    credentials = Credentials(server="https://x", cert_pem=client.cert_pem, key_pem=_encrypted(client.key_pem),
                              pair_origin="user 'u' in FILE: client-key KEY")
    with pytest.raises(KubeconfigError, match="user 'u' in FILE: client-key KEY: the key is encrypted"):
        ssl_context(credentials)
