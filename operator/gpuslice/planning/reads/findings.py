"""What a diagnosis is made of (pure): the requests of a claim it judges, and what it finds."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Finding:
    code: str  # NotATenant, NotAdmitted, OverLimit, NoFreeDevice, KeptOff, AdmissionDenied, ...
    message: str
    blocking: bool = True


@dataclass(frozen=True)
class Request:
    """One device request of a claim (a subrequest of firstAvailable counts on its own)."""

    claim: str  # the claim's name, or "<pod claim gpu> (not created yet)"
    name: str
    device_class: str
    count: int = 1
    all_devices: bool = False
    admin: bool = False
    memory: int | None = None  # capacity.requests.memory
    selectors: tuple[str, ...] = ()  # its CEL selectors' expressions, which narrow the class
    match: tuple[str, ...] = ()  # attributes its devices must share (matchAttribute constraints of its own)
