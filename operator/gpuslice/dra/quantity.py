"""Kubernetes resource quantities (``10Gi``, ``500M``, ``1.5Gi``) as exact integers."""

from __future__ import annotations

import re
from fractions import Fraction

_SUFFIXES: dict[str, int | Fraction] = {
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
    "n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 10**3), "": 1,
    "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
}
_PATTERN = re.compile(
    r"^([+-]?(?:\d+\.?\d*|\.\d+))(?:([eE][+-]?\d+)|(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?)$"
)


def parse_quantity(text: str) -> Fraction:
    """The exact value of ``text``; ValueError names what a quantity looks like."""
    match = _PATTERN.match(text.strip()) if isinstance(text, str) else None
    if match is None:
        raise ValueError(f"{text!r} is not a Kubernetes quantity (examples: 10Gi, 512Mi, 40G)")
    number, exponent, suffix = match.groups()
    value = Fraction(number)
    if exponent:
        return value * Fraction(10) ** int(exponent[1:])
    return value * _SUFFIXES[suffix or ""]


def quantity_bytes(text: str) -> int:
    """A quantity rounded up to whole units, as Kubernetes does for byte counts."""
    value = parse_quantity(text)
    return -(-value.numerator // value.denominator)


def format_bytes(value: int) -> str:
    """The shortest exact form, binary before decimal: 10737418240 -> ``10Gi``, 10**10 -> ``10G``."""
    forms = [str(value)]
    for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki", "E", "P", "T", "G", "M", "k"):
        unit = _SUFFIXES[suffix]
        assert isinstance(unit, int)
        if value and value % unit == 0:
            forms.append(f"{value // unit}{suffix}")
    return min(forms, key=len)
