"""Validation rules written once, enforced twice.

Each rule is a CEL expression the apiserver evaluates at admission (it goes
into the CRD as ``x-kubernetes-validations``) and the same check in Python, so
``gpuslice plan -f policy.yaml`` and the controller reject exactly what the
apiserver would, with the same message.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, model_validator
from pydantic.alias_generators import to_camel

DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"


def cel_regex(pattern: str) -> str:
    """A CEL raw string literal holding ``pattern`` (no escaping to get wrong)."""
    assert "'" not in pattern
    return f"r'{pattern}'"


@dataclass(frozen=True)
class Rule:
    cel: str | None  # None: the schema enforces it structurally (e.g. list-map keys), Python mirrors it
    message: str
    check: Callable[[Any], bool]
    field_path: str | None = None  # where the apiserver reports the error, e.g. ".sliceSize"

    def crd(self) -> dict[str, str]:
        assert self.cel is not None
        rule = {"rule": self.cel, "message": self.message}
        if self.field_path:
            rule["fieldPath"] = self.field_path
        return rule


class ApiModel(BaseModel):
    """camelCase on the wire, snake_case in Python; unknown fields ignored (a newer CRD may add some)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, frozen=True, extra="ignore")

    rules: ClassVar[tuple[Rule, ...]] = ()

    @model_validator(mode="after")
    def _apply_rules(self) -> ApiModel:
        failed = [rule.message for rule in type(self).rules if not rule.check(self)]
        if failed:
            raise ValueError("; ".join(failed))
        return self

    @classmethod
    def cel_rules(cls) -> list[dict[str, str]]:
        return [rule.crd() for rule in cls.rules if rule.cel is not None]
