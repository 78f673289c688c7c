"""Read models (pure): what the API server holds about gpuslice's devices and claims, read into
the answers of ``status``, ``why``, ``plan --cluster``, ``defrag`` and the controller's retries."""
