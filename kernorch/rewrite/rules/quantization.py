"""Quantization round trips: a dequantization reading what a quantization just wrote computes on the same values.

QuantizeLinear's integer step (`saturating_round`) yields whole numbers within the integer type's range, so
casting them to that type and back to float32 returns them unchanged: cast(cast(v, int8), float32) is v. A QDQ
model writes that pair between every two of its operators; without it the dequantization reads the rounded
values directly and the chain is two primitives shorter, so more of it fits one kernel (the integer value stays
where another consumer reads it: an integer product).
"""

from __future__ import annotations

import numpy as np

from kernorch.ir.types import STORAGE_DTYPES
from kernorch.rewrite.engine import Replacement, RewriteContext, rewrite_rule


def _whole(array: np.ndarray | None) -> bool:
    return array is not None and bool(np.all(np.isfinite(array)) and np.all(np.floor(array) == array))


@rewrite_rule("quantization-round-trip", roots=["cast"])
def quantization_round_trip(ctx: RewriteContext) -> Replacement | None:
    """cast(cast(saturating_round(x, offset, low, high), I), float32) is the saturating round itself, where its
    offset and bounds are whole constants and the bounds lie within I's range."""
    narrowed = ctx.producer(ctx.node.inputs[0])
    if narrowed is None or narrowed.prim != "cast" or ctx.node.attr("to") != "float32":
        return None
    rounded = narrowed.inputs[0]
    step = ctx.producer(rounded)
    target = ctx.type(narrowed.outputs[0]).dtype  # bfloat16 has no numpy dtype: its kind is not asked
    if step is None or step.prim != "saturating_round" or ctx.type(rounded).dtype != "float32" \
            or target in STORAGE_DTYPES or np.dtype(target).kind not in "iu":  # fmt: skip
        return None
    bounds = np.iinfo(target)
    offset, low, high = (ctx.const(v) for v in step.inputs[1:])
    if not (_whole(offset) and _whole(low) and _whole(high)):
        return None
    assert low is not None and high is not None  # _whole says so
    if float(low.min()) < bounds.min or float(high.max()) > bounds.max:
        return None
    return {ctx.node.outputs[0]: rounded}


# Scales whose products with 8- and 16-bit integers stay normal floats: dividing the product by the scale then
# lands within two ulps of the integer, and rounding recovers it exactly
_SCALE_RANGE = (2.0**-100, 2.0**100)


def _same(a: np.ndarray | None, b: np.ndarray | None) -> bool:
    return a is not None and b is not None and a.shape == b.shape and bool(np.array_equal(a, b))


@rewrite_rule("requantization-same-grid", roots=["saturating_round"])
def requantization_same_grid(ctx: RewriteContext) -> Replacement | None:
    """saturating_round((q − z) · s / s, z, low, high) is q itself, where q is a saturating round whose bounds lie
    within [low, high]: a quantization of what the dequantization of q just gave, on the same grid (a QDQ model
    writes one where the operator between its pair was an identity). q − z is a whole number of at most 16 bits,
    (q − z) · s / s is within two ulps of it for a scale s whose products stay normal, rounding gives it back, z
    makes it q, and the bounds leave it. Saves a division and a rounding a value."""
    step = ctx.node
    quotient = ctx.producer(step.inputs[0])
    product = ctx.producer(quotient.inputs[0]) if quotient is not None and quotient.prim == "div" else None
    centred = ctx.producer(product.inputs[0]) if product is not None and product.prim == "mul" else None
    if quotient is None or product is None or centred is None or centred.prim not in ("add", "sub"):
        return None
    rounded = ctx.producer(centred.inputs[0])
    if rounded is None or rounded.prim != "saturating_round":
        return None
    offset, low, high = (ctx.const(v) for v in step.inputs[1:])
    _, first_low, first_high = (ctx.const(v) for v in rounded.inputs[1:])
    shift, scale = ctx.const(centred.inputs[1]), ctx.const(product.inputs[1])
    if shift is None or scale is None or not _same(scale, ctx.const(quotient.inputs[1])) or scale.size != 1:
        return None
    if not (_whole(offset) and _whole(first_low) and _whole(first_high)):
        return None
    assert offset is not None and first_low is not None and first_high is not None  # _whole says so
    if not _same(shift, -offset if centred.prim == "add" else offset):  # (q − z) + z: q
        return None
    magnitude = abs(float(scale.reshape(())))
    if not _SCALE_RANGE[0] <= magnitude <= _SCALE_RANGE[1]:
        return None
    if low is None or high is None:
        return None
    if float(np.max(low)) > float(np.min(first_low)) or float(np.min(high)) < float(np.max(first_high)):
        return None  # q may lie outside the second bounds: saturated
    if max(abs(float(first_low.min())), abs(float(first_high.max()))) + float(np.abs(offset).max()) > 2**16:
        return None  # q − z beyond 16 bits
    q = rounded.outputs[0]
    if ctx.type(q) != ctx.type(step.outputs[0]):
        return None
    return {step.outputs[0]: q}
