"""The node agent's kubelet plugin: registration, prepare and unprepare, CDI, checkpoints, health."""
