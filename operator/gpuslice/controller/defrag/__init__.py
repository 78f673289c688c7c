"""The controller's defragmentation: it reads the cluster as the planner needs (``read``, which
``gpuslice defrag`` and ``why`` use too), carries every recorded move out (``move``), starts moves in
Auto mode (``auto``) and counts them (``metrics``). What to move is decided in ``planning.defrag``."""
