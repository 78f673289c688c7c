"""Each pod's real GPU use on this node (``collector``): who holds which device (the kubelet's
PodResources API, ``podresources``), what runs on each GPU (the backend), which pod each process
belongs to (its cgroup), measured against the allocations (``planning.node.gpu_use``), exported as
metrics (``metrics``) and acted on when a pod uses more than it was allocated (``actions``)."""
