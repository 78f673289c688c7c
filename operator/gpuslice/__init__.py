"""gpuslice: per-tenant GPU slicing policy turned into native Dynamic Resource Allocation."""

__version__ = "0.1.0"
