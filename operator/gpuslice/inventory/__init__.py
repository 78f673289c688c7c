"""What GPUs a node has: the catalog of known models and node inventories (pure, no I/O)."""
