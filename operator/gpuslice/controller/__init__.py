"""The policy controller: GpuSlicePolicy -> DeviceClasses, claim templates, quota, admission, status."""
