from gpuslice.bench.run import main

main()
