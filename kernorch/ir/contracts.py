"""Checks a primitive's shape inference makes of its attributes: every value the generated code indexes with is
an integer in the range ONNX allows. A saved plan is hostile input and `verify` re-infers every node when it is
loaded, so these checks are what stands between an edited plan.json and an out-of-bounds access.

Each raises ValueError naming the attribute; `verify` turns it into a one-line refusal naming the node.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# Elements in one tensor: 2^40 (4 TiB of float32) is beyond any machine kernorch runs on, and far from where
# an int64 product of dimensions would wrap.
MAX_ELEMENTS = 2**40


def integer(value: Any, name: str, low: int | None = None, high: int | None = None) -> int:
    """`value` as an int in [low, high] (bools are not integers here)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f"[{'-inf' if low is None else low}, {'inf' if high is None else high}]"
        raise ValueError(f"{name} = {value} is out of range {bounds}")
    return value


def integers(values: Any, name: str, length: int | None = None, low: int | None = None) -> tuple[int, ...]:
    if not isinstance(values, (tuple, list)):
        raise ValueError(f"{name} must be a list of integers, got {values!r}")
    if length is not None and len(values) != length:
        raise ValueError(f"{name} needs {length} values, got {len(values)}")
    return tuple(integer(v, f"{name}[{i}]", low) for i, v in enumerate(values))


def axis(value: Any, rank: int, name: str = "axis") -> int:
    """A normalized axis of a tensor of `rank` (0 <= axis < rank)."""
    return integer(value, name, 0, rank - 1)


def one_of(value: Any, name: str, allowed: Sequence[Any]) -> Any:
    if value not in allowed:
        raise ValueError(f"{name} = {value!r} is not one of {', '.join(map(repr, allowed))}")
    return value


def elements(shape: Sequence[int], what: str) -> int:
    """The element count of `shape`, refused beyond MAX_ELEMENTS (also where int64 arithmetic would wrap)."""
    count = 1
    for d in shape:
        count *= d
        if count > MAX_ELEMENTS:
            raise ValueError(f"{what} of shape {tuple(shape)} has more than 2^40 elements")
    return count
