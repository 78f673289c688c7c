"""Generate the GpuSlicePolicy CRD from the pydantic models.

pydantic's JSON Object is close to a structural OpenAPI v3 schema; what
differs is fixed here: references are inlined, ``Optional`` unions become
plain optional properties, titles go, and each model's rules become
``x-kubernetes-validations``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import yaml

from gpuslice.api.agent_view import VIEW_KIND, VIEW_PLURAL
from gpuslice.api.ledger import LEDGER_KIND, LEDGER_PLURAL, LedgerSpec, LedgerStatus
from gpuslice.api.policy import GROUP, KIND, MAX_NAME, PLURAL, VERSION, GpuSlicePolicySpec
from gpuslice.api.rules import DNS_LABEL, ApiModel
from gpuslice.api.status import GpuSlicePolicyStatus
from gpuslice.jsontypes import Object


def _models(root: type[ApiModel]) -> dict[str, type[ApiModel]]:
    """Every ApiModel reachable from ``root``, by the name pydantic gives its schema."""
    found: dict[str, type[ApiModel]] = {}

    def visit(model: type[ApiModel]) -> None:
        if model.__name__ in found:
            return
        found[model.__name__] = model
        for field in model.model_fields.values():
            for candidate in _types_in(field.annotation):
                if isinstance(candidate, type) and issubclass(candidate, ApiModel):
                    visit(candidate)

    visit(root)
    return found


def _types_in(annotation: Any) -> list[Any]:
    args = getattr(annotation, "__args__", None)
    if not args:
        return [annotation]
    return [t for arg in args for t in _types_in(arg)]


def structural(root: type[ApiModel]) -> Object:
    schema = root.model_json_schema(by_alias=True)
    definitions: dict[str, Object] = schema.pop("$defs", {})
    models = _models(root)

    def convert(node: Object, model_name: str | None = None) -> Object:
        node = copy.deepcopy(node)
        if "$ref" in node:
            name = node.pop("$ref").rsplit("/", 1)[1]
            extra = {k: v for k, v in node.items() if k in ("description", "default")}
            return {**convert(definitions[name], name), **extra}
        if "anyOf" in node:
            options = [o for o in node.pop("anyOf") if o.get("type") != "null"]
            if len(options) != 1:
                raise ValueError(f"cannot express union {options} in a structural schema")
            rest = {k: v for k, v in node.items() if k not in ("title",)}
            if rest.get("default", ...) is None:
                rest.pop("default")
            return {**convert(options[0]), **rest}
        node.pop("title", None)
        node.pop("propertyNames", None)  # not in structural schemas; key rules are CEL
        if "const" in node:
            node["enum"] = [node.pop("const")]
        if node.get("type") == "object" or "properties" in node:
            node["type"] = "object"
            node.pop("additionalProperties", None) if "properties" in node else None
            props = node.get("properties", {})
            node["properties"] = {key: convert(value) for key, value in props.items()}
            if not node["properties"]:
                node.pop("properties")
            if isinstance(node.get("additionalProperties"), dict):
                node["additionalProperties"] = convert(node["additionalProperties"])
        if node.get("type") == "array" and "items" in node:
            node["items"] = convert(node["items"])
        if "default" in node and node["default"] in ({}, []):
            node.pop("default")  # empty defaults only add noise to stored objects
        if model_name and model_name in models and (rules := models[model_name].cel_rules()):
            node["x-kubernetes-validations"] = rules
        return node

    return convert(schema, root.__name__)


def _definition(kind: str, plural: str, scope: str, short: str, root: Object,
                columns: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": scope,
            "names": {
                "kind": kind, "listKind": f"{kind}List", "plural": plural,
                "singular": kind.lower(), "shortNames": [short], "categories": ["gpuslice"],
            },
            "versions": [{
                "name": VERSION,
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": root},
                "additionalPrinterColumns": columns,
            }],
        },
    }


def _root(description: str, spec: Object, status: Object) -> Object:
    return {
        "type": "object",
        "description": description,
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
    }


def crd() -> dict[str, Any]:
    root = _root("GpuSlicePolicy turns a set of GPUs into slices that tenant namespaces claim through Dynamic"
                 " Resource Allocation.", structural(GpuSlicePolicySpec), structural(GpuSlicePolicyStatus))
    root["x-kubernetes-validations"] = [{
        "rule": f"self.metadata.name.matches('{DNS_LABEL}') && size(self.metadata.name) <= {MAX_NAME}",
        "message": f"GpuSlicePolicy names must be lowercase letters, digits and '-', at most"
                   f" {MAX_NAME} characters: they name the DeviceClass <name>.{GROUP}",
    }]
    columns = [
        ("Mode", "string", ".spec.slicing.mode", 0),
        ("Slice", "string", ".spec.slicing.sliceSize", 0),
        # A column shows only the first item of a list: the controller writes the names as one string.
        ("Tenants", "string", ".status.tenantNames", 0),
        ("Nodes", "integer", ".status.nodes", 0),
        ("GPUs", "integer", ".status.gpus", 0),
        ("Published", "integer", ".status.slices.published", 0),
        ("Allocated", "integer", ".status.slices.allocated", 0),
        ("Ready", "string", '.status.conditions[?(@.type=="Ready")].status', 0),
        ("Degraded", "string", '.status.conditions[?(@.type=="Degraded")].status', 0),
        ("Reason", "string", '.status.conditions[?(@.type=="Ready")].reason', 1),
        ("Degraded-Reason", "string", '.status.conditions[?(@.type=="Degraded")].reason', 1),
        ("Age", "date", ".metadata.creationTimestamp", 0),
    ]
    return _definition(KIND, PLURAL, "Cluster", "gsp", root, [
        {"name": n, "type": t, "jsonPath": p, **({"priority": pr} if pr else {})} for n, t, p, pr in columns])


def ledger_crd() -> dict[str, Any]:
    """GpuSliceLedger: namespaced (it lives in gpuslice's namespace only), with a status subresource so
    that the controller's writes (spec: the limit) and the webhook's (status: the charges) are
    separate rights."""
    root = _root("What a tenant with maxMemory holds of one GpuSlicePolicy's devices, charge by charge (written by"
                 " gpuslice only).", structural(LedgerSpec), structural(LedgerStatus))
    columns = [
        ("Policy", "string", ".spec.policy"), ("Tenant", "string", ".spec.namespace"),
        ("Max-Memory", "string", ".spec.maxMemory"), ("Held-Bytes", "integer", ".status.heldBytes"),
        ("Limit-Bytes", "integer", ".spec.limitBytes"), ("Since", "date", ".status.since"),
    ]
    return _definition(LEDGER_KIND, LEDGER_PLURAL, "Namespaced", "gsl", root,
                       [{"name": n, "type": t, "jsonPath": p} for n, t, p in columns])


def agent_view_crd() -> dict[str, Any]:
    """GpuSliceAgentView (api.agent_view): namespaced (gpuslice's namespace only), written by the controller
    only. The policy's spec and the moves in flight are kept as the policy has them (the policy's own
    schema judged them when they were written there); the agent parses them as it parses a policy."""
    def free() -> Object:
        return {"type": "object", "x-kubernetes-preserve-unknown-fields": True}

    def string() -> Object:
        return {"type": "string"}

    def integer() -> Object:
        return {"type": "integer"}

    spec = {
        "type": "object",
        "description": "What a node agent plans from, of the GpuSlicePolicy of the same name.",
        "properties": {
            "policy": {"type": "object", "description": "The policy's identity and age.", "properties": {
                "uid": string(), "generation": integer(), "creationTimestamp": string(),
                "deletionTimestamp": string()}},
            "spec": {**free(), "description": "The policy's nodeSelector, gpuSelector, slicing and taints."},
            "observedGeneration": {**integer(), "description": "The generation the controller's verdict is on."},
            "valid": {"type": "object", "description": "The policy's Valid condition.",
                      "properties": {"status": string(), "reason": string()}},
            "inFlight": {"type": "array", "description": "status.defragmentation.inFlight of the policy.",
                         "items": free()},
        },
    }
    root = _root("What node agents plan from, of one GpuSlicePolicy: written by the gpuslice controller, so that"
                 " a write of a policy's status reaches no agent.", spec, {"type": "object"})
    columns = [("Generation", "integer", ".spec.policy.generation"), ("Judged", "integer", ".spec.observedGeneration"),
               ("Valid", "string", ".spec.valid.status"), ("Reason", "string", ".spec.valid.reason")]
    return _definition(VIEW_KIND, VIEW_PLURAL, "Namespaced", "gsav", root,
                       [{"name": n, "type": t, "jsonPath": p} for n, t, p in columns])


CRDS = {"gpuslicepolicies.gpuslice.dev.yaml": crd, f"{LEDGER_PLURAL}.{GROUP}.yaml": ledger_crd,
        f"{VIEW_PLURAL}.{GROUP}.yaml": agent_view_crd}


def crd_yaml(make: Callable[[], dict[str, Any]] = crd) -> str:
    header = "# Generated from operator/gpuslice/api by `make crds`; do not edit.\n"
    return header + yaml.safe_dump(make(), sort_keys=False, width=100)


if __name__ == "__main__":
    import sys

    print(crd_yaml(CRDS[sys.argv[1]] if len(sys.argv) > 1 else crd), end="")
