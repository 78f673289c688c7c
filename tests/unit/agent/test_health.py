"""The agent's /readyz follows its last successful publish, not merely that the process is alive."""

from __future__ import annotations

from gpuslice.agent.run import publish_ready


def test_not_ready_before_the_first_successful_publish() -> None:
    assert publish_ready(0.0, 1000.0, 120.0) == (False, "no publish cycle has succeeded yet")


def test_ready_while_a_publish_succeeded_recently() -> None:
    assert publish_ready(950.0, 1000.0, 120.0) == (True, "ok")


def test_not_ready_once_publishing_has_failed_for_too_long() -> None:
    ok, words = publish_ready(800.0, 1000.0, 120.0)
    assert not ok
    assert "200 s" in words


def test_not_ready_while_the_kubelet_plugin_starts_nor_once_stopping() -> None:
    assert publish_ready(950.0, 1000.0, 120.0, plugin_starting=True) == (
        False, "the kubelet plugin has not started yet (recovering its checkpoints)")
    assert publish_ready(950.0, 1000.0, 120.0, stopping=True) == (False, "stopping")
