"""The GpuSlicePolicy API: pydantic models, CRD generation, semantic validation."""
