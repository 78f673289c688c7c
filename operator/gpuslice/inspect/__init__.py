"""What a platform engineer looks at: ``gpuslice status``, ``why``, ``plan --cluster``, ``defrag`` and the kubectl
plugin, read from the API server and printed from the pure models of ``planning.reads``."""
