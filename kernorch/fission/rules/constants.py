"""Rules for operators that produce compile-time constants (shape arithmetic, literal tensors).

None of them emits a primitive: with static shapes their results are known at import.
"""

from __future__ import annotations

import numpy as np
from onnx import numpy_helper

from kernorch.fission.registry import RuleContext, rule
from kernorch.frontend.onnx_import import onnx_dtype_name


@rule("Constant")
def constant(ctx: RuleContext) -> list[str]:
    for name, to_array in (
        ("value", lambda v: numpy_helper.to_array(v)),
        ("value_float", lambda v: np.array(v, dtype=np.float32)),
        ("value_floats", lambda v: np.array(v, dtype=np.float32)),
        ("value_int", lambda v: np.array(v, dtype=np.int64)),
        ("value_ints", lambda v: np.array(v, dtype=np.int64)),
    ):
        if ctx.has_attr(name):
            if name == "value":
                onnx_dtype_name(ctx.node.attribute[0].t.data_type, ctx.node.name)
            return [ctx.constant(to_array(ctx.attr(name)), hint="constant")]
    ctx.refuse("only tensor, float(s) and int(s) constant values are supported")


@rule("Shape")
def shape(ctx: RuleContext) -> list[str]:
    dims = ctx.type(0).shape
    start, end = ctx.attr("start", 0), ctx.attr("end", None)
    return [ctx.constant(np.array(dims[slice(start, end)], dtype=np.int64), hint="shape")]


@rule("Size")
def size(ctx: RuleContext) -> list[str]:
    return [ctx.constant(np.array(ctx.type(0).numel, dtype=np.int64), hint="size")]


@rule("ConstantOfShape", static_inputs=(0,))
def constant_of_shape(ctx: RuleContext) -> list[str]:
    dims = [int(d) for d in ctx.const(0, "shape").reshape(-1)]
    if min(dims, default=0) < 0:
        ctx.refuse(f"negative dimension in {dims}")
    fill = ctx.attr("value", None)
    value = np.zeros(1, dtype=np.float32) if fill is None else numpy_helper.to_array(fill)
    onnx_dtype_name(fill.data_type if fill is not None else 1, ctx.node.name)
    return [ctx.constant(np.full(dims, value.reshape(-1)[0], dtype=value.dtype), hint="filled")]


@rule("Range", static_inputs=(0, 1, 2))
def range_rule(ctx: RuleContext) -> list[str]:
    start, limit, delta = (ctx.const(i, name) for i, name in enumerate(("start", "limit", "delta")))
    if delta == 0:
        ctx.refuse("delta is 0")
    count = max(int(np.ceil((limit - start) / delta)), 0)
    values = start + np.arange(count, dtype=start.dtype) * delta
    return [ctx.constant(values.astype(start.dtype), hint="range")]
