"""The node agent's kubelet plugin: registration, prepare and unprepare, CDI, recovery, health. What it
prepared is kept in the node's state (``agent.node_state``), which the pool reads too."""
