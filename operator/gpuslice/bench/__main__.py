"""``python -m gpuslice.bench``: what ``make bench`` runs."""

from gpuslice.bench.run import main

main()
