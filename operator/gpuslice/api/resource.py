"""The whole GpuSlicePolicy object, as the controller reads it."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

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
