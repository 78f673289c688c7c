"""Typed builders and naming/limit rules for resource.k8s.io objects (pure, no I/O)."""
