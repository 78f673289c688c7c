from gpuslice.cli import main

main()
