"""``make bench``: packing, scheduler cost, scale and planner speed, measured in one run.

The pure parts (``trace``, ``packing``, ``requests``, ``report``) are typed and do no I/O; the
rest drives a real control plane. Nothing here is imported by ``gpuslice controller`` or
``gpuslice agent``.
"""
