"""docs/reference/api.md: gpuslice's API, every field of its CRDs as the API server reads them.

Made from the committed CRDs (``crds/``, themselves generated from ``operator/gpuslice/api``), so it
says what the API server enforces: each field's type, default and validation, and each CEL rule with
the message a refused write gets.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from text import prose, wrap  # hack/docs/text.py

# Kubernetes' validation keywords, as they read in a sentence.
BOUNDS = {"minimum": "≥ {}", "maximum": "≤ {}", "exclusiveMinimum": "> {}", "exclusiveMaximum": "< {}",
          "minLength": "at least {} characters", "maxLength": "at most {} characters",
          "minItems": "at least {} items", "maxItems": "at most {} items",
          "minProperties": "at least {} entries", "maxProperties": "at most {} entries",
          "pattern": "matches `{}`", "format": "format `{}`", "multipleOf": "a multiple of {}"}
Schema = dict[str, Any]


def _type(schema: Schema) -> str:
    if schema.get("x-kubernetes-int-or-string"):
        return "integer or string"
    kind = str(schema.get("type", "any"))
    if kind == "array":
        return "[]" + _type(schema.get("items", {}))
    if kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        return "map[string]" + _type(schema["additionalProperties"])
    return kind


def _cel(schema: Schema) -> list[str]:
    """Each CEL rule's message (what a refused write is told), else the rule itself."""
    found = []
    for rule in schema.get("x-kubernetes-validations", []):
        if rule.get("message"):
            found.append(prose(rule["message"]))
        elif "messageExpression" in rule:
            found.append(f"(message from `{rule['messageExpression']}`)")
        else:
            found.append(f"`{rule['rule']}`")
    return found


def _rules(schema: Schema) -> list[str]:
    found = [template.format(schema[key]) for key, template in BOUNDS.items() if key in schema]
    if "enum" in schema:
        found.append("one of " + ", ".join(f"`{json.dumps(v)}`" for v in schema["enum"]))
    if schema.get("nullable"):
        found.append("may be null")
    if schema.get("uniqueItems"):
        found.append("no item twice")
    if "x-kubernetes-list-type" in schema:
        keys = schema.get("x-kubernetes-list-map-keys")
        found.append(f"list type `{schema['x-kubernetes-list-type']}`"
                     + (f" keyed by {', '.join(f'`{k}`' for k in keys)}" if keys else ""))
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        found.append("any fields kept")
    return found


def _field(path: str, schema: Schema, required: bool) -> list[str]:
    facts = [_type(schema)] + (["required"] if required else [])
    if "default" in schema:
        facts.append(f"default `{json.dumps(schema['default'])}`")
    facts += _rules(schema)
    lines = wrap(f"- `{path}`: " + ", ".join(facts) + ".", then="  ")
    if schema.get("description"):
        lines += wrap(prose(schema["description"]), "  ")
    return lines + [line for message in _cel(schema) for line in wrap(f"CEL: “{message}”", "    - ")]


def _fields(schema: Schema, path: str, required: bool) -> Iterator[str]:
    """This field's lines and those of every field below it."""
    yield from _field(path, schema, required)
    inner, suffix = schema, ""
    while True:  # through lists and maps to what they hold
        if inner.get("type") == "array" and "items" in inner:
            inner, suffix = inner["items"], suffix + "[]"
        elif isinstance(inner.get("additionalProperties"), dict):
            inner, suffix = inner["additionalProperties"], suffix + "[*]"
        else:
            break
        if _rules(inner) or _cel(inner) or "default" in inner:  # each item has rules of its own
            yield from _field(path + suffix, {k: v for k, v in inner.items() if k != "description"}, False)
    needed = set(inner.get("required", []))
    for name, child in inner.get("properties", {}).items():
        yield from _fields(child, f"{path}{suffix}.{name}", name in needed)


def _version(crd: Schema, version: Schema) -> list[str]:
    names = crd["spec"]["names"]
    root = version["schema"]["openAPIV3Schema"]
    lines = [f"### {crd['spec']['group']}/{version['name']}", "",
             f"Served: {str(version.get('served')).lower()}; storage: {str(version.get('storage')).lower()};"
             f" subresources: {', '.join(version.get('subresources', {})) or 'none'}.", ""]
    if root.get("description"):
        lines += [*wrap(prose(root["description"])), ""]
    columns = version.get("additionalPrinterColumns", [])
    if columns:
        lines += [*wrap(f"`kubectl get {names['plural']}` prints: "
                         + ", ".join(f"{c['name']} (`{c['jsonPath']}`)" for c in columns) + "."), ""]
    if _cel(root):
        lines += ["On the whole object:", "", *[line for m in _cel(root) for line in wrap(f"CEL: “{m}”", "- ")], ""]
    needed = set(root.get("required", []))
    for name, child in root.get("properties", {}).items():
        if name not in ("apiVersion", "kind", "metadata"):
            lines += [f"#### `{name}`", "", *_fields(child, name, name in needed), ""]
    return lines


def _crd(crd: Schema, file: str) -> list[str]:
    names = crd["spec"]["names"]
    short = ", ".join(f"`{n}`" for n in names.get("shortNames", []))
    lines = [f"## {names['kind']}", "",
             *wrap(f"`{crd['metadata']['name']}` (`crds/{file}`): scope {crd['spec']['scope']}, plural"
                    f" `{names['plural']}`" + (f", short name {short}" if short else "") + "."), ""]
    for version in crd["spec"]["versions"]:
        lines += _version(crd, version)
    return lines


def render(crds: Path) -> str:
    lines = ["<!-- Generated by `make reference` (hack/docs/api_page.py) from crds/; do not edit. -->",
             "# API reference", "",
             "Every field of gpuslice's custom resources, as the API server checks them: the committed CRDs",
             "(`make crds` generates them from `operator/gpuslice/api`). A field's validation is the OpenAPI",
             "schema's and its CEL rules' (quoted: the message a refused write gets); the controller then checks",
             "a policy against the real GPUs, and says what it refused in the policy's `Valid` condition.",
             "`[]` is each item of a list, `[*]` each value of a map; a CEL rule is quoted by its message.",
             "What a policy becomes:",
             "[tenants.md](../tenants.md), [modes.md](../modes.md).", ""]
    for path in sorted(crds.glob("*.yaml"), key=lambda p: ("policies" not in p.name, p.name)):
        crd = yaml.safe_load(path.read_text())
        if crd.get("kind") == "CustomResourceDefinition":
            lines += _crd(crd, path.name)
    return "\n".join(lines)
