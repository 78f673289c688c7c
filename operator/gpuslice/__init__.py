"""gpuslice: per-tenant GPU slicing policy turned into native Dynamic Resource Allocation."""

# The one version of gpuslice: the package (pyproject.toml reads it), `gpuslice --version`, the image
# tag (make image), the manifests' images and the chart's version and appVersion (make manifests).
# CHANGELOG.md has an entry for it; tests/unit/test_version.py holds them all to it.
__version__ = "0.1.0"
