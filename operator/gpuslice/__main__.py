"""``python -m gpuslice``: the ``gpuslice`` command, where its script is not on the PATH."""

from gpuslice.cli import main

main()
