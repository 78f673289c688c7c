"""Logs: JSON lines by default off a terminal, Kopf's lines keep the object they are about."""

from __future__ import annotations

import json
import logging

import pytest
import structlog

from gpuslice.observability.logging import configure_logging


def lines(captured: pytest.CaptureFixture[str]) -> list[dict[str, object]]:
    return [json.loads(line) for line in captured.readouterr().err.splitlines() if line.strip()]


def test_kopf_lines_name_their_object_as_ours_do(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("info", "json")
    ref = {"apiVersion": "gpuslice.dev/v1alpha1", "kind": "GpuSlicePolicy", "name": "inference", "uid": "u"}
    logging.getLogger("kopf.objects").warning("Handler 'policy_changed' failed temporarily", extra={"k8s_ref": ref})
    structlog.get_logger("gpuslice.controller").info("reconciled", policy="inference")
    kopf_line, ours = lines(capsys)
    assert kopf_line["policy"] == ours["policy"] == "inference"
    assert kopf_line["object"] == {"kind": "GpuSlicePolicy", "name": "inference"}
    assert kopf_line["level"] == "warning"


def test_a_claim_is_named_with_its_namespace(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("info", "json")
    ref = {"kind": "ResourceClaim", "name": "gpu-x", "namespace": "team-a"}
    logging.getLogger("kopf.objects").error("boom", extra={"k8s_ref": ref})
    assert lines(capsys)[0]["claim"] == "team-a/gpu-x"


def test_the_level_filters_and_console_lines_are_not_json(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("warning", "console")
    structlog.get_logger("x").info("quiet")
    structlog.get_logger("x").warning("loud", node="n1")
    text = capsys.readouterr().err
    assert "quiet" not in text
    assert "loud" in text
    assert "node" in text
    assert not text.lstrip().startswith("{")


def test_an_unknown_level_is_refused() -> None:
    with pytest.raises(ValueError, match="use one of debug, info, warning, error"):
        configure_logging("loud")


def test_a_console_traceback_shows_no_local_variables(capsys: pytest.CaptureFixture[str]) -> None:
    """rich's tracebacks print every frame's locals by default: a request's headers (Authorization),
    an exec plugin's environment. A person pastes a traceback into an issue."""
    configure_logging("info", "console")

    def send(headers: dict[str, str]) -> None:
        authorization = headers["Authorization"]
        raise ConnectionError(f"refused ({len(authorization)} bytes of credentials)")

    try:
        send({"Authorization": "Bearer " + "-".join(("s3cr3t", "token"))})  # not in the source rich shows
    except ConnectionError:
        structlog.get_logger("x").exception("request failed")
    text = capsys.readouterr().err
    assert "ConnectionError" in text
    assert "s3cr3t-token" not in text


def test_credentials_do_not_print_their_secrets() -> None:
    from gpuslice.kube.credentials import Credentials, ExecPlugin

    credentials = Credentials(server="https://x", token="s3cr3t-token", basic=("jane", "pa55word"),
                              key_pem=b"PRIVATE-KEY", auth_provider={"config": {"id-token": "id-t0ken"}},
                              exec_plugin=ExecPlugin("aws", "client.authentication.k8s.io/v1", "user u",
                                                     env=(("AWS_SECRET_ACCESS_KEY", "aws-s3cr3t"),)))
    text = repr(credentials)
    assert "https://x" in text
    for secret in ("s3cr3t-token", "pa55word", "PRIVATE-KEY", "id-t0ken", "aws-s3cr3t"):
        assert secret not in text
