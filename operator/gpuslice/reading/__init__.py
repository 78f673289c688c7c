"""Reads of the API server that more than one component shares (I/O over ``planning.reads``).

The controller's defragmentation and scheduler retry, and the CLI's ``defrag`` and ``why``, read
the same things the same way; this layer sits under both, so the CLI need not import the
controller to read the cluster as the controller does.
"""
