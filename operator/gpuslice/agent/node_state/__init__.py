"""What the node keeps about its GPUs, below both the pool and the kubelet plugin: the claims' checkpoints
(what prepare did, on disk) and the calls that change a GPU, one at a time per GPU."""
