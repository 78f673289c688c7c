"""NVIDIA MPS for memory and shared slices of policies with ``slicing.isolation: MPS``: one
control daemon per GPU and tenant namespace, supervised by the node agent (``daemons``), started by the backend's
command (``nvidia-cuda-mps-control`` on NVIDIA nodes, ``standin`` on fake ones)."""
