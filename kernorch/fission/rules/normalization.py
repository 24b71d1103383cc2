"""Fission rules for softmax and the normalization operators (reduce + broadcast + elementwise)."""

from __future__ import annotations

from kernorch.fission.registry import RuleContext, rule
from kernorch.fission.rules.common import channel_param, mean_over, normalize, reshape
from kernorch.ir.types import FLOAT_DTYPES


def _softmax_axes(ctx: RuleContext) -> tuple[int, ...]:
    rank = ctx.type(0).rank
    if ctx.type(0).dtype not in FLOAT_DTYPES:
        ctx.refuse(f"dtype {ctx.type(0).dtype} is not supported")
    if ctx.opset >= 13:
        return (ctx.normalize_axis(ctx.attr("axis", -1), rank),)
    # Before opset 13 the input is coerced to 2-D at `axis`: the reduction spans every later axis.
    return tuple(range(ctx.normalize_axis(ctx.attr("axis", 1), rank), rank))


@rule("Softmax", "LogSoftmax")
def softmax(ctx: RuleContext) -> list[str]:
    # Numerically stable: subtract the row max before exponentiating.
    axes = _softmax_axes(ctx)
    x = ctx.input(0)
    shifted = ctx.emit("sub", x, ctx.emit("reduce_max", x, axes=axes))
    exponentials = ctx.emit("exp", shifted)
    total = ctx.emit("reduce_sum", exponentials, axes=axes)
    if ctx.op == "LogSoftmax":
        return [ctx.emit("sub", shifted, ctx.emit("log", total))]
    return [ctx.emit("div", exponentials, total)]


def _affine(ctx: RuleContext, y: str, scale_index: int, bias_index: int, rank: int, axis: int | None) -> str:
    """y * scale + bias; per-channel params are reshaped to broadcast along `axis` when given."""
    for index, prim in ((scale_index, "mul"), (bias_index, "add")):
        if ctx.has_input(index):
            param = ctx.input(index)
            if axis is not None:
                param = channel_param(ctx, param, rank, axis)
            y = ctx.emit(prim, y, param)
    return y


def _trailing_statistics(ctx: RuleContext) -> tuple[str, tuple[int, ...], bool]:
    """LayerNorm/RMSNorm's operand: (x, the axes from `axis` on, whether float16 was upcast), statistics in
    float32 (stash_type 1)."""
    x_type = ctx.type(0)
    if x_type.dtype not in FLOAT_DTYPES:
        ctx.refuse(f"dtype {x_type.dtype} is not supported")
    ctx.allow("stash_type", 1, default=1)
    axis = ctx.normalize_axis(ctx.attr("axis", -1), x_type.rank)
    upcast = x_type.dtype == "float16"
    x = ctx.emit("cast", ctx.input(0), to="float32") if upcast else ctx.input(0)
    return x, tuple(range(axis, x_type.rank)), upcast


@rule("LayerNormalization", min_opset=17)
def layer_normalization(ctx: RuleContext) -> list[str]:
    x, axes, upcast = _trailing_statistics(ctx)
    normalized, mean, inv_std = normalize(ctx, x, axes, ctx.attr("epsilon", 1e-5))
    if upcast:
        normalized = ctx.emit("cast", normalized, to="float16")
    return [_affine(ctx, normalized, 1, 2, ctx.type(0).rank, None), mean, inv_std]


@rule("InstanceNormalization")
def instance_normalization(ctx: RuleContext) -> list[str]:
    x_type = ctx.type(0)
    if x_type.dtype not in FLOAT_DTYPES or x_type.rank < 3:
        ctx.refuse(f"needs a float tensor of rank >= 3, got {x_type}")
    normalized, _, _ = normalize(ctx, ctx.input(0), tuple(range(2, x_type.rank)), ctx.attr("epsilon", 1e-5))
    return [_affine(ctx, normalized, 1, 2, x_type.rank, 1)]


@rule("GroupNormalization", min_opset=21)
def group_normalization(ctx: RuleContext) -> list[str]:
    # Opset 18's per-group scale/bias definition is deprecated (the ONNX checker rejects it).
    x_type = ctx.type(0)
    groups = ctx.attr("num_groups")
    if x_type.dtype not in FLOAT_DTYPES or x_type.rank < 3 or not groups or x_type.shape[1] % groups:
        ctx.refuse(f"needs a float tensor of rank >= 3 with channels divisible by num_groups, got {x_type}")
    ctx.allow("stash_type", 1, default=1)
    batch = x_type.shape[0]
    grouped = reshape(ctx, ctx.input(0), [batch, groups, x_type.numel // (batch * groups)])
    normalized, _, _ = normalize(ctx, grouped, (2,), ctx.attr("epsilon", 1e-5))
    return [_affine(ctx, reshape(ctx, normalized, x_type.shape), 1, 2, x_type.rank, 1)]


@rule("BatchNormalization")
def batch_normalization(ctx: RuleContext) -> list[str]:
    x_type = ctx.type(0)
    if x_type.dtype not in FLOAT_DTYPES:
        ctx.refuse(f"dtype {x_type.dtype} is not supported")
    if ctx.opset >= 14:
        ctx.allow("training_mode", 0, default=0)
    if ctx.opset < 9:
        ctx.allow("spatial", 1, default=1)
    if ctx.opset < 7:
        ctx.allow("is_test", 1, default=0)
    if len([o for o in ctx.node.output if o]) > 1:
        ctx.refuse("training outputs (running mean/var) are not supported")
    ctx.attr("momentum")  # only used in training
    dtype = x_type.dtype
    rank = x_type.rank
    scale, bias, mean, var = (channel_param(ctx, ctx.input(i), rank) for i in (1, 2, 3, 4))
    epsilon = ctx.scalar(ctx.attr("epsilon", 1e-5), dtype)
    inv_std = ctx.emit("reciprocal", ctx.emit("sqrt", ctx.emit("add", var, epsilon)))
    factor = ctx.emit("mul", scale, inv_std)  # folds to a constant for a trained model
    return [ctx.emit("add", ctx.emit("mul", ctx.emit("sub", ctx.input(0), mean), factor), bias)]


@rule("LpNormalization")
def lp_normalization(ctx: RuleContext) -> list[str]:
    """x / ||x||_p along one axis (p = 1 or 2); where the norm is zero, so is x, and the result is 0 (as the
    ONNX reference says), not 0/0."""
    x_type = ctx.type(0)
    if x_type.dtype not in FLOAT_DTYPES:
        ctx.refuse(f"dtype {x_type.dtype} is not supported")
    axis = ctx.normalize_axis(ctx.attr("axis", -1), x_type.rank)
    p = ctx.allow("p", 1, 2, default=2)
    x = ctx.input(0)
    if p == 1:
        norm = ctx.emit("reduce_sum", ctx.emit("abs", x), axes=(axis,))
    else:
        norm = ctx.emit("sqrt", ctx.emit("reduce_sum", ctx.emit("mul", x, x), axes=(axis,)))
    dtype = x_type.dtype
    divisor = ctx.emit("where", ctx.emit("equal", norm, ctx.scalar(0, dtype)), ctx.scalar(1, dtype), norm)
    return [ctx.emit("div", x, divisor)]


@rule("RMSNormalization", min_opset=23)
def rms_normalization(ctx: RuleContext) -> list[str]:
    """x / sqrt(mean(x², axes from `axis` on) + epsilon) * scale, statistics in float32 (stash_type 1)."""
    x, axes, upcast = _trailing_statistics(ctx)
    dtype = ctx.builder.type_of(x).dtype
    mean_square = mean_over(ctx, ctx.emit("mul", x, x), axes)
    epsilon = ctx.scalar(ctx.attr("epsilon", 1e-5), dtype)
    normalized = ctx.emit("mul", x, ctx.emit("reciprocal", ctx.emit("sqrt", ctx.emit("add", mean_square, epsilon))))
    if upcast:
        normalized = ctx.emit("cast", normalized, to="float16")
    return [ctx.emit("mul", normalized, ctx.input(1))]
