"""Whether kube-scheduler would put a pod on a node at all, before any device is counted (pure).

The defragmenter frees a GPU for a waiting pod, and places the pods it moves, only on nodes the
pod may go to; the scheduler retry asks only for pods some node with a free device would take.
What is judged is what the pod says about nodes: its ``nodeSelector``, its required node affinity
(``requiredDuringSchedulingIgnoredDuringExecution``: the terms ORed, a term's expressions and
fields ANDed) and its tolerations of the node's NoSchedule and NoExecute taints (a cordoned node
counts as tainted ``node.kubernetes.io/unschedulable``). Not judged: the node's CPU, memory and
pods left, pod (anti-)affinity, topology spread; what fails there waits like any pod.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuslice.jsontypes import Body

UNSCHEDULABLE = "node.kubernetes.io/unschedulable"


@dataclass(frozen=True)
class NodeFacts:
    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Mapping[str, Any], ...] = ()  # NoSchedule and NoExecute ones (a cordon included)

    @classmethod
    def from_body(cls, body: Body) -> NodeFacts:
        meta, spec = body.get("metadata") or {}, body.get("spec") or {}
        taints = [t for t in spec.get("taints") or [] if t.get("effect") in ("NoSchedule", "NoExecute")]
        if spec.get("unschedulable") and not any(t.get("key") == UNSCHEDULABLE for t in taints):
            taints.append({"key": UNSCHEDULABLE, "effect": "NoSchedule"})
        return cls(str(meta.get("name", "")), dict(meta.get("labels") or {}), tuple(taints))


@dataclass(frozen=True)
class Placement:
    """What a pod says about the nodes it may go to."""

    node_selector: Mapping[str, str] = field(default_factory=dict)
    required_terms: tuple[Mapping[str, Any], ...] | None = None  # None: no required node affinity
    tolerations: tuple[Mapping[str, Any], ...] = ()

    @classmethod
    def from_spec(cls, spec: Body) -> Placement:
        required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                    .get("requiredDuringSchedulingIgnoredDuringExecution"))
        terms = None if required is None else tuple(required.get("nodeSelectorTerms") or [])
        return cls(dict(spec.get("nodeSelector") or {}), terms, tuple(spec.get("tolerations") or []))


def _number(text: Any) -> int | None:
    try:
        return int(str(text))
    except ValueError:
        return None


def _requirement(requirement: Body, value: str | None) -> bool:
    """One node selector requirement against the label (or field) ``value``; None: absent."""
    operator, values = str(requirement.get("operator", "")), [str(v) for v in requirement.get("values") or []]
    if operator == "In":
        return value is not None and value in values
    if operator == "NotIn":
        return value is None or value not in values
    if operator == "Exists":
        return value is not None
    if operator == "DoesNotExist":
        return value is None
    if operator in ("Gt", "Lt") and value is not None and len(values) == 1:
        have, bound = _number(value), _number(values[0])
        if have is None or bound is None:
            return False
        return have > bound if operator == "Gt" else have < bound
    return False


def _term(term: Body, node: NodeFacts) -> bool:
    expressions, fields = term.get("matchExpressions") or [], term.get("matchFields") or []
    if not expressions and not fields:
        return False  # an empty term selects no node
    return (all(_requirement(r, node.labels.get(str(r.get("key")))) for r in expressions)
            and all(_requirement(r, node.name if r.get("key") == "metadata.name" else None) for r in fields))


def _tolerates(toleration: Body, taint: Body) -> bool:
    effect = toleration.get("effect") or ""
    if effect and effect != taint.get("effect"):
        return False
    key, operator = toleration.get("key") or "", toleration.get("operator") or "Equal"
    if not key:
        return operator == "Exists"  # an empty key with Exists tolerates every taint
    if key != taint.get("key"):
        return False
    return operator == "Exists" or (operator == "Equal" and (toleration.get("value") or "") == (taint.get("value")
                                                                                                or ""))


def refusal(placement: Placement, node: NodeFacts) -> str | None:
    """None when the pod may go to ``node``; else why not, in a few words."""
    if any(node.labels.get(k) != v for k, v in placement.node_selector.items()):
        return f"its nodeSelector does not match node {node.name}"
    if placement.required_terms is not None and not any(_term(t, node) for t in placement.required_terms):
        return f"its required node affinity does not match node {node.name}"
    untolerated = [t for t in node.taints if not any(_tolerates(o, t) for o in placement.tolerations)]
    if untolerated:
        taint = untolerated[0]
        return (f"it does not tolerate node {node.name}'s taint {taint.get('key')}"
                f"{'=' + str(taint['value']) if taint.get('value') else ''}:{taint.get('effect')}")
    return None


def nodes_by_name(nodes: Sequence[Body]) -> dict[str, NodeFacts]:
    return {facts.name: facts for facts in (NodeFacts.from_body(n) for n in nodes)}
