"""Hostile review, December (third round), T: `gpuslice status` prints what a node published as
text, never as rich markup.

The fix for T (b1e9829) escapes every control character read from the cluster, and renders cells
as ``Text`` because "a ``str`` cell would be read as rich markup (``[link=...]`` is an escape
sequence too)" (inspect/render/terminal.py). The topology table, added with the aligned templates
after that fix, passes ``str`` cells: each GPU's NVLink domain, NUMA node and PCIe root, read from
the node's ResourceSlice. A node's credentials (its agent's token, stolen: the December review's
H2/H4; or its kubelet's, which may publish a slice of its own node) publish those attribute
values, up to 64 characters each, with no other check. ``[link=URL]...[/link]`` then becomes an
OSC 8 hyperlink on the platform engineer's terminal, and ``[conceal]`` hides the text after it.

A promise test: it asserts the value is shown as written and no OSC 8 sequence is printed, so it
fails while the hole is open.
"""

from __future__ import annotations

import pytest

from gpuslice.kube.client import KubeClient, KubeError
from tests.cluster.cli import Cli
from tests.cluster.gpu_nodes import GpuNodeFactory
from tests.cluster.kubeutil import wait_for
from tests.cluster.operator_fixtures import ControllerProcess, PolicyFactory
from tests.cluster.pools import SLICES, published, tenant_policy

ROOT = "resource.kubernetes.io/pcieRoot"
NVLINK = "gpuslice.dev/nvlinkDomain"  # a node with an NVLink domain or a NUMA node gets the topology table
MARKUP = "[link=https://evil.example/x]pci0000:15[/link][conceal]"  # 55 characters: within the API's 64


async def test_status_shows_a_published_attribute_as_written_and_links_nothing(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, gpu_node: GpuNodeFactory,
    namespace: str, gpuslice: Cli, monkeypatch: pytest.MonkeyPatch,
) -> None:
    node = await gpu_node("h100-80gb", 1)
    await tenant_policy(make_policy, namespace, node.name, {"mode": "memory", "sliceSize": "20G"})
    await published(kube, node.name, 4)
    await node.agent.stop()  # its token is stolen (or the node's kubelet's is used)
    said = ""
    async with await KubeClient.from_kubeconfig(node.kubeconfig) as as_node:
        for item in await as_node.list(SLICES, fieldSelector=f"spec.nodeName={node.name}"):
            for device in item["spec"].get("devices") or []:
                if ROOT in (device.get("attributes") or {}):
                    device["attributes"][ROOT] = {"string": MARKUP}
                    device["attributes"][NVLINK] = {"string": MARKUP}
            try:
                await as_node.replace(f"{SLICES}/{item['metadata']['name']}", item)
            except KubeError as error:
                said = error.message
    print("T the node's token rewrote its slice's pcieRoot:", said or "admitted")

    async def shown() -> bool:
        result = await gpuslice("status")
        return "Topology" in result.stdout

    await wait_for(shown, within=30, what="the topology table in gpuslice status")
    plain = await gpuslice("status")
    monkeypatch.setenv("FORCE_COLOR", "1")  # as on a terminal: rich then writes its styles, and links
    colour = await gpuslice("status")
    lines = [line for line in plain.stdout.splitlines() if "pci" in line or "evil" in line]
    print("T gpuslice status (no terminal), the lines with the root:", lines)
    print("T gpuslice status (FORCE_COLOR=1), the OSC 8 and conceal sequences:",
          [line for line in colour.stdout.splitlines() if "\x1b]8;" in line or "\x1b[8m" in line])
    assert not said, f"the node's credentials could not write the attribute (the hole is closed another way): {said}"
    assert "\x1b]8;" not in colour.stdout, "a value a node published became a hyperlink on the terminal"
    assert "\x1b[8m" not in colour.stdout, "a value a node published hid the text after it"
    assert any("[link=https://evil.example/x]" in line for line in lines), (
        f"the published value {MARKUP!r} is not shown as written: {lines}")
