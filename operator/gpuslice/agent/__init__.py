"""The node agent: GPU inventory, the node's pool of devices, and publishing it safely."""
