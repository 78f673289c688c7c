"""``spec.topology``: claim templates for several whole GPUs that sit together (docs/topology.md).

Each count gets a template whose one request is a ``firstAvailable`` list, one subrequest per
alignment in the order given, each constrained by ``matchAttribute`` on the attributes the
alignment names; the scheduler takes the first that a node can give whole, and the allocation
result names the subrequest it took (``gpus/nvlink-numa``), which says the alignment granted.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from gpuslice.api.rules import ApiModel, Rule
from gpuslice.inventory.topology import Alignment, alignment_name

MAX_ALIGNED = 32  # the most devices one claim may be allocated (AllocationResultsMaxSize)
MAX_ALTERNATIVES = 8  # firstAvailable's limit on subrequests
AlignedCount = Annotated[int, Field(ge=2, le=MAX_ALIGNED)]


class AlignmentChoice(ApiModel):
    """One way the GPUs of a claim may sit together."""

    match: list[Alignment] = Field(max_length=3, description=(
        "What every GPU of the claim shares: NVLink (one NVLink domain: GPUs NVLink connects all-to-all,"
        " gpuslice.dev/nvlinkDomain), NUMANode (one NUMA node, resource.kubernetes.io/numaNode), PCIeRoot (one PCIe"
        " root, resource.kubernetes.io/pcieRoot). Empty: any GPUs of one node, as a last resort. GPUs that publish"
        " no such attribute (no NVLink, NUMA node unknown) never meet it."),
        json_schema_extra={"x-kubernetes-list-type": "set"})

    @property
    def name(self) -> str:
        """The subrequest's name, and what the claim's allocation says was granted: ``nvlink-numa``."""
        return alignment_name(self.match)


def default_alignments() -> list[AlignmentChoice]:
    """NVLink and one NUMA node, then NVLink, then one PCIe root, then one NUMA node: never any GPUs."""
    return [AlignmentChoice(match=["NVLink", "NUMANode"]), AlignmentChoice(match=["NVLink"]),
            AlignmentChoice(match=["PCIeRoot"]), AlignmentChoice(match=["NUMANode"])]


def _same(a: str, b: str) -> str:
    return f"(size({a}.match) == size({b}.match) && {a}.match.all(x, x in {b}.match))"


class Topology(ApiModel):
    """Claim templates for several whole GPUs of this policy that sit together: one per count, named
    <claimTemplateName>-full-x<count>, for each tenant that may hold that many whole GPUs."""

    counts: list[AlignedCount] = Field(min_length=1, max_length=8, description=(
        f"How many whole GPUs each aligned template asks for, e.g. [2, 4, 8]: 2 to {MAX_ALIGNED} each."),
        json_schema_extra={"x-kubernetes-list-type": "set"})
    alignments: list[AlignmentChoice] = Field(
        default_factory=default_alignments, min_length=1, max_length=MAX_ALTERNATIVES, description=(
            "How the GPUs of a claim must sit together, tried in order: the scheduler gives a claim the first"
            " alignment some node can meet whole, else the claim waits. Unset: NVLink and NUMANode, then NVLink,"
            " then PCIeRoot, then NUMANode (never GPUs that share nothing). The claim's allocation names the"
            " alignment granted: status.allocation.devices.results[].request is gpus/<alignment>, e.g."
            " gpus/nvlink-numa."))

    rules = (
        Rule("!has(self.alignments) || self.alignments.all(a, self.alignments.exists_one(b, " + _same("a", "b") + "))",
             "topology.alignments lists the same alignment twice; list each once",
             lambda s: len({c.name for c in s.alignments}) == len(s.alignments), ".alignments"),
        Rule(None,  # the schema's list-type "set" rejects duplicates ("Duplicate value")
             "topology.counts lists a number twice; list each once",
             lambda s: len(set(s.counts)) == len(s.counts), ".counts"),
    )
