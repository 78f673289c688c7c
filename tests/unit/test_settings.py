"""Settings: every field a flag and an environment variable, documented where people read it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuslice.cli import DOCUMENTED, main
from gpuslice.controller.settings import ControllerSettings
from gpuslice.settings import markdown

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_the_docs_tables_are_the_models() -> None:
    text = DOC.read_text()
    for name, model in DOCUMENTED.items():
        found = re.search(rf"<!-- settings: {name} -->\n(.*?)<!-- end -->", text, re.S)
        assert found, f"docs/configuration.md has no settings list for {name}"
        assert found.group(1) == markdown(model), f"docs/configuration.md is stale for {name}: make reference"


def test_every_field_says_what_it_is() -> None:
    for model in DOCUMENTED.values():
        for name, field in model.model_fields.items():
            assert len(field.description or "") > 20, f"{model.__name__}.{name} needs a description"


def test_an_environment_variable_sets_a_flag_and_the_flag_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[ControllerSettings] = []

    async def run_controller(settings: ControllerSettings) -> None:
        seen.append(settings)

    monkeypatch.setattr("gpuslice.controller.run.run_controller", run_controller)
    runner = CliRunner()
    result = runner.invoke(main, ["controller"], env={"GPUSLICE_STATUS_INTERVAL": "1.5",
                                                      "GPUSLICE_LEADER_ELECTION": "false"})
    assert result.exit_code == 0, result.output
    result = runner.invoke(main, ["controller", "--status-interval", "3"], env={"GPUSLICE_STATUS_INTERVAL": "1.5"})
    assert result.exit_code == 0, result.output
    assert [(s.status_interval, s.leader_election) for s in seen] == [(1.5, False), (3.0, True)]


def test_settings_that_contradict_each_other_are_refused() -> None:
    result = CliRunner().invoke(main, ["controller", "--renew-deadline", "20"])
    assert result.exit_code == 2
    assert "retry_period < renew_deadline < lease_duration" in result.output
