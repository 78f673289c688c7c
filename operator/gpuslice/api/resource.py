"""The whole GpuSlicePolicy object, as the controller reads it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import ErrorDetails

from gpuslice.api.policy import GpuSlicePolicySpec
from gpuslice.api.status import GpuSlicePolicyStatus


class ObjectMeta(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)

    name: str
    uid: str = ""
    generation: int = 0
    creation_timestamp: str = Field(default="", alias="creationTimestamp")
    deletion_timestamp: str | None = Field(default=None, alias="deletionTimestamp")
    resource_version: str = Field(default="", alias="resourceVersion")


class GpuSlicePolicy(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    metadata: ObjectMeta
    spec: GpuSlicePolicySpec
    status: GpuSlicePolicyStatus = Field(default_factory=GpuSlicePolicyStatus)

    @classmethod
    def from_body(cls, body: Any) -> GpuSlicePolicy:
        return cls.model_validate(dict(body))

    @property
    def name(self) -> str:
        return self.metadata.name


@dataclass(frozen=True)
class ParseProblem:
    """Why a GpuSlicePolicy body does not parse: pydantic's errors, in order. Each reader words them
    for its own reader (a status condition, ``gpuslice why``, ``plan``), from the same list."""

    error: ValidationError

    @property
    def errors(self) -> Sequence[ErrorDetails]:
        return self.error.errors()

    @property
    def first(self) -> str:
        """``spec.slicing.sliceSize: <what is wrong>``: the first field only."""
        first = self.errors[0] if self.errors else None
        return f"{_where(first)}: {first['msg']}" if first else f": {self.error}"

    def fields(self, limit: int | None = None) -> str:
        """``<field>: <what is wrong>`` of the first ``limit`` errors (all: None), joined by '; '."""
        return "; ".join(f"{_where(e)}: {e['msg']}" for e in self.errors[:limit])


def _where(error: ErrorDetails) -> str:
    return ".".join(str(part) for part in error["loc"])


def parse_policy(body: Any) -> GpuSlicePolicy | ParseProblem:
    """The policy of a GpuSlicePolicy body, or why it does not parse (the one place bodies become models)."""
    try:
        return GpuSlicePolicy.from_body(body)
    except ValidationError as error:
        return ParseProblem(error)


def valid_policy(body: Any) -> GpuSlicePolicy | None:
    """The policy, or None when its body does not parse (whoever reconciles it reports why)."""
    parsed = parse_policy(body)
    return parsed if isinstance(parsed, GpuSlicePolicy) else None
