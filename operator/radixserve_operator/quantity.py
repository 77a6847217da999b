"""Kubernetes quantities ("8Gi", "1.5G", "500m", 1000), parsed cheaply and bounded.

The CRD's pattern (`crd.QUANTITY_PATTERN`) bounds the digits and the exponent, so a value costs
microseconds to parse here; a resource stored under an older, looser CRD is held to the same
pattern and to `crd.MAX_QUANTITY` before any arithmetic, so "1e1000000" never becomes a
million-digit integer."""

from __future__ import annotations

import re
from decimal import Decimal

from radixserve_operator.crd import MAX_QUANTITY, QUANTITY_MAX_LENGTH, QUANTITY_PATTERN

_GRAMMAR = re.compile(QUANTITY_PATTERN)
_SPLIT = re.compile(r"^\+?([0-9.]+)([KMGTPE]i|[numkMGTPE]|[eE][+-]?[0-9]+)?$")
_SUFFIXES = {
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
    "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), None: 1,
    "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
}  # fmt: skip


class QuantityError(ValueError):
    """Not a quantity the operator accepts (malformed, negative or beyond MAX_QUANTITY)."""


def parse_quantity(q: str | float, maximum: int = MAX_QUANTITY) -> Decimal:
    """The quantity's value in its base unit (bytes, cores); raises QuantityError."""
    if isinstance(q, bool):
        raise QuantityError(f"not a quantity: {q!r}")
    if isinstance(q, int):
        value = Decimal(q)
    else:
        text = str(q).strip()
        if len(text) > QUANTITY_MAX_LENGTH or not _GRAMMAR.match(text):
            raise QuantityError(
                f"not a quantity (digits, an optional fraction and one suffix such as Gi, M, m, "
                f"e3; at most {QUANTITY_MAX_LENGTH} characters): {text[:40]!r}"
            )
        m = _SPLIT.match(text)
        assert m is not None  # the grammar above is narrower
        number, suffix = Decimal(m.group(1)), m.group(2)
        if suffix not in _SUFFIXES:  # a decimal exponent, bounded to two digits
            value = number.scaleb(int(suffix[1:]))
        else:
            value = number * _SUFFIXES[suffix]
    if value < 0 or value > maximum:
        raise QuantityError(f"{q!r} is out of range: at most {maximum} units (bytes or cores)")
    return value


def quantity_bytes(q: str | float) -> int:
    """A bounded quantity in whole units (bytes for memory)."""
    return int(parse_quantity(q))
