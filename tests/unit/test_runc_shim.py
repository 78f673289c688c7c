"""hack/kind/runc-shim: runc minus the capabilities this machine's bounding set lacks."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

SHIM = Path(__file__).resolve().parents[2] / "hack" / "kind" / "runc-shim"


def load_shim() -> ModuleType:
    loader = importlib.machinery.SourceFileLoader("runc_shim", str(SHIM))
    spec = importlib.util.spec_from_loader("runc_shim", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


shim = load_shim()
ALL = ["CAP_CHOWN", "CAP_SYS_ADMIN", "CAP_SYS_RESOURCE", "CAP_NET_ADMIN"]


@pytest.fixture
def fake_runc(tmp_path: Path) -> Path:
    """A runc that records its arguments and the files the shim was to edit."""
    runc = tmp_path / "runc"
    runc.write_text(f"#!{sys.executable}\nimport json, sys\n"
                    f"json.dump(sys.argv[1:], open({str(tmp_path / 'argv.json')!r}, 'w'))\n")
    runc.chmod(0o755)
    return runc


def run_shim(fake_runc: Path, *args: str) -> list[str]:
    env = {**os.environ, "GPUSLICE_RUNC": str(fake_runc)}
    subprocess.run([sys.executable, str(SHIM), *args], env=env, check=True)
    return list(json.loads((fake_runc.parent / "argv.json").read_text()))


def test_the_subcommand_is_found_after_global_options() -> None:
    command, rest = shim.command_and_options(
        ["--root", "/run/runc", "--log", "/x.log", "--log-format", "json", "--systemd-cgroup", "create",
         "--bundle", "/b", "id"])
    assert command == "create"
    assert rest == ["--bundle", "/b", "id"]
    assert shim.option(rest, "--bundle", "-b") == "/b"
    assert shim.option(["--bundle=/c"], "--bundle", "-b") == "/c"


def test_only_missing_capabilities_are_removed() -> None:
    caps = {"bounding": list(ALL), "effective": list(ALL), "permitted": ["CAP_CHOWN"]}
    assert shim.strip(caps, {"CAP_SYS_RESOURCE"})
    assert caps == {"bounding": ["CAP_CHOWN", "CAP_SYS_ADMIN", "CAP_NET_ADMIN"],
                    "effective": ["CAP_CHOWN", "CAP_SYS_ADMIN", "CAP_NET_ADMIN"], "permitted": ["CAP_CHOWN"]}
    assert not shim.strip(caps, {"CAP_SYS_RESOURCE"})


@pytest.mark.parametrize("flag", ["--bundle", "-b"])
def test_create_edits_the_bundle_config_then_runs_runc_with_the_same_arguments(
        tmp_path: Path, fake_runc: Path, flag: str) -> None:
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    config = {"process": {"capabilities": {"bounding": ALL, "effective": ALL}}, "root": {"path": "rootfs"}}
    (bundle / "config.json").write_text(json.dumps(config))
    args = ["--root", "/run/x", "create", flag, str(bundle), "ctr-1"]
    assert run_shim(fake_runc, *args) == args
    edited = json.loads((bundle / "config.json").read_text())
    missing = shim.missing_capabilities()  # this machine's: CAP_SYS_RESOURCE on gpuslice's CI
    assert edited["process"]["capabilities"]["bounding"] == [c for c in ALL if c not in missing]
    assert edited["root"] == config["root"]


def test_exec_edits_the_process_file(tmp_path: Path, fake_runc: Path) -> None:
    process = tmp_path / "process.json"
    process.write_text(json.dumps({"args": ["sh"], "capabilities": {"bounding": ALL}}))
    run_shim(fake_runc, "exec", "--process", str(process), "ctr-1")
    missing = shim.missing_capabilities()
    assert json.loads(process.read_text())["capabilities"]["bounding"] == [c for c in ALL if c not in missing]


def test_other_commands_pass_through_untouched(tmp_path: Path, fake_runc: Path) -> None:
    assert run_shim(fake_runc, "--root", "/run/x", "state", "ctr-1") == ["--root", "/run/x", "state", "ctr-1"]
