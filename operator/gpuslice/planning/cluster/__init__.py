"""The controller's cluster objects (pure): what a policy needs besides its devices (DeviceClasses,
templates, quota) and gpuslice's admission rules."""
