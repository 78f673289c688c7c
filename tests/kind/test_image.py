"""The image on kind: what it installed is what constraints.txt pins, and no cli extra."""

from __future__ import annotations

import json

from tests.kind.kindutil import REPO, Kind


def test_the_image_has_what_constraints_txt_pins_and_no_cli_extra(deployed: Kind) -> None:
    pins = {name.lower().replace("_", "-"): version for name, version in (
        line.split("==") for line in (REPO / "constraints.txt").read_text().splitlines()
        if line and not line.startswith("#"))}
    pod = deployed.items("pods", "-n", "gpuslice-system")[0]["metadata"]["name"]
    found = deployed.kubectl("-n", "gpuslice-system", "exec", pod, "--", "python3", "-c", (
        "import json, importlib.metadata as m; print(json.dumps({d.metadata['Name'].lower().replace('_', '-'):"
        " d.version for d in m.distributions()}))"))
    installed = json.loads(found)
    installed.pop("gpuslice")
    assert installed == pins, "the image installs exactly what constraints.txt pins: no more (no cli extra), no less"
