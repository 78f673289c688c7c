module gpuslice.dev/hack/kind

go 1.26.0
