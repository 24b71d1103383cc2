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
