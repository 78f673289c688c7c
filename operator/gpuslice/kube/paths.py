"""REST paths of the kinds gpuslice manages: the generic helpers of ``gpuslice.coordinates``, where
every path is built (it sits at the bottom layer so the pure core can use it too)."""

from __future__ import annotations

from gpuslice.coordinates import KINDS as KINDS
from gpuslice.coordinates import collection as collection
from gpuslice.coordinates import object_path as object_path
