"""Algebraic simplification (MindSpore graph-kernel style): fewer or cheaper elementwise operations.

Each rule only fires where it removes work or moves a constant next to another constant, so the
fixed point terminates; the float results differ at most by reassociation.
"""

from __future__ import annotations

import numpy as np

from kernorch.ir.graph import Node
from kernorch.ir.primitives import PRIMITIVES, STEP_FUNCTIONS, Kind
from kernorch.ir.types import FLOAT_DTYPES
from kernorch.rewrite.engine import Replacement, RewriteContext, rewrite_rule


def _float(ctx: RewriteContext, value: str) -> bool:
    return ctx.type(value).is_float


@rewrite_rule("neg-neg", roots=["neg"])
def double_negation(ctx: RewriteContext) -> Replacement | None:
    """neg(neg(x)) is x."""
    inner = ctx.producer(ctx.node.inputs[0])
    if inner is None or inner.prim != "neg":
        return None
    return {ctx.node.outputs[0]: inner.inputs[0]}


@rewrite_rule("exp-pow", roots=["pow"])
def power_of_exponential(ctx: RewriteContext) -> Replacement | None:
    """exp(a)^b is exp(a·b): one transcendental instead of two."""
    base, exponent = ctx.node.inputs
    inner = ctx.producer(base)
    if inner is None or inner.prim != "exp" or not _float(ctx, base):
        return None
    return {ctx.node.outputs[0]: ctx.emit("exp", ctx.emit("mul", inner.inputs[0], exponent))}


SMALL_POWERS = (2, 3, 4)


@rewrite_rule("small-power", roots=["pow"])
def small_integer_power(ctx: RewriteContext) -> Replacement | None:
    """x^2, x^3, x^4 with a constant scalar exponent are products: multiplications instead of a `pow` call
    (GELU-tanh's x³); IEEE powers of these exponents are the same products, signs and NaNs included."""
    base, exponent = ctx.node.inputs
    value = ctx.const(exponent)
    if value is None or value.size != 1 or not _float(ctx, base) or ctx.type(ctx.node.outputs[0]) != ctx.type(base):
        return None
    power = float(value.reshape(()))
    if power not in SMALL_POWERS:
        return None
    square = ctx.emit("mul", base, base)
    result = {2: square, 3: ctx.emit("mul", square, base), 4: ctx.emit("mul", square, square)}[int(power)]
    return {ctx.node.outputs[0]: result}


@rewrite_rule("tanh-plus-one", roots=["add"])
def tanh_plus_one(ctx: RewriteContext) -> Replacement | None:
    """1 + tanh(u) is 2·sigmoid(2u) (GELU-tanh's `0.5·x·(1 + tanh(u))`): the generated sigmoid is one exp and
    one division, tanh is that plus a polynomial and two selects. Exact in real arithmetic, and more accurate
    in float32 where tanh(u) is near -1 (no cancellation)."""
    split = _split_constant(ctx, ctx.node.inputs)
    if split is None or not _float(ctx, ctx.node.outputs[0]):
        return None
    value, one = split
    constant = ctx.const(one)
    inner = ctx.producer(value)
    if (constant is None or constant.size != 1 or float(constant.reshape(())) != 1.0 or inner is None
            or inner.prim != "tanh" or not ctx.single_use(value)
            or ctx.type(ctx.node.outputs[0]) != ctx.type(value)):  # fmt: skip
        return None
    two = ctx.constant(np.asarray(2.0, dtype=constant.dtype))
    return {ctx.node.outputs[0]: ctx.emit("mul", ctx.emit("sigmoid", ctx.emit("mul", inner.inputs[0], two)), two)}


@rewrite_rule("reduce-reduce", roots=["reduce_sum", "reduce_max", "reduce_min", "reduce_prod"])
def nested_reduction(ctx: RewriteContext) -> Replacement | None:
    """reduce(reduce(x, A), B) with A, B disjoint and the same reducer is one reduce over A ∪ B."""
    node = ctx.node
    inner = ctx.producer(node.inputs[0])
    if inner is None or inner.prim != node.prim or not ctx.single_use(node.inputs[0]):
        return None
    outer_axes, inner_axes = set(node.attr("axes")), set(inner.attr("axes"))
    if outer_axes & inner_axes:
        return None
    return {node.outputs[0]: ctx.emit(node.prim, inner.inputs[0], axes=tuple(sorted(outer_axes | inner_axes)))}


@rewrite_rule("div-by-constant", roots=["div"])
def division_by_constant(ctx: RewriteContext) -> Replacement | None:
    """x / c with a float constant c is x · (1/c): a multiply is cheaper and folds with other constants. Not where
    the quotient is rounded to an integer or divides another value (a quantization's x / scale, its scale): x · (1/c)
    can be one rounding off x / c, and a value rounded there lands one quantization step off onnxruntime's."""
    numerator, denominator = ctx.node.inputs
    if ctx.const(denominator) is None or not _float(ctx, numerator):
        return None
    quotient = ctx.node.outputs[0]
    if any(_needs_exact(consumer, quotient) for consumer in ctx.consumers(quotient)):
        return None
    return {quotient: ctx.emit("mul", numerator, ctx.emit("reciprocal", denominator))}


def _needs_exact(consumer: Node, value: str) -> bool:
    """Whether `consumer` turns a rounding difference in `value` into a different integer or quotient."""
    if consumer.prim in STEP_FUNCTIONS:
        return True
    if consumer.prim == "cast" and consumer.attr("to") not in FLOAT_DTYPES:
        return True
    return consumer.prim == "div" and consumer.inputs[1] == value


@rewrite_rule("sub-constant", roots=["sub"])
def subtraction_of_constant(ctx: RewriteContext) -> Replacement | None:
    """x − c with a float constant c is x + (−c), so it can merge with neighbouring additions."""
    left, right = ctx.node.inputs
    if ctx.const(right) is None or ctx.const(left) is not None or not _float(ctx, left):
        return None
    return {ctx.node.outputs[0]: ctx.emit("add", left, ctx.emit("neg", right))}


def _split_constant(ctx: RewriteContext, inputs: tuple[str, ...]) -> tuple[str, str] | None:
    """(variable, constant) operands of a binary node with exactly one constant operand."""
    a, b = inputs
    if ctx.const(b) is not None and ctx.const(a) is None:
        return a, b
    if ctx.const(a) is not None and ctx.const(b) is None:
        return b, a
    return None


def _constant_chain(ctx: RewriteContext, inner_prim: str) -> tuple[str, str, str] | None:
    """The root is op(inner_prim(x, c1), c2) on floats, constants on either side and the inner result
    used only here: (x, c1, c2)."""
    node = ctx.node
    outer = _split_constant(ctx, node.inputs)
    if outer is None or not _float(ctx, node.outputs[0]):
        return None
    value, c2 = outer
    inner = ctx.producer(value)
    if inner is None or inner.prim != inner_prim or not ctx.single_use(value):
        return None
    inner_split = _split_constant(ctx, inner.inputs)
    return None if inner_split is None else (*inner_split, c2)


@rewrite_rule("merge-constants", roots=["add", "mul"])
def merge_constants(ctx: RewriteContext) -> Replacement | None:
    """(x + c1) + c2 is x + (c1 + c2); (x · c1) · c2 is x · (c1 · c2): the constants fold."""
    node = ctx.node
    chain = _constant_chain(ctx, node.prim)
    if chain is None:
        return None
    x, c1, c2 = chain
    return {node.outputs[0]: ctx.emit(node.prim, x, ctx.emit(node.prim, c1, c2))}


@rewrite_rule("scales-out-of-product", roots=["mul"])
def scales_out_of_product(ctx: RewriteContext) -> Replacement | None:
    """(x · c1) · (y · c2) with scalar constants is (x · y) · (c1 · c2): one multiply fewer, none when c1 · c2
    is 1 (neutral-operand drops it). GELU-tanh after tanh-plus-one is (x · 0.5) · (sigmoid(2z) · 2), i.e.
    x · sigmoid(2z); with powers of two the product is the same to the bit."""
    node = ctx.node
    parts = []
    for value in node.inputs:
        producer = ctx.producer(value)
        split = None if producer is None or producer.prim != "mul" or not ctx.single_use(value) else \
            _split_constant(ctx, producer.inputs)  # fmt: skip
        constant = None if split is None else ctx.const(split[1])
        if split is None or constant is None or constant.size != 1 or not _float(ctx, value):
            return None
        parts.append(split)
    (x, c1), (y, c2) = parts
    if ctx.type(x).shape != ctx.type(node.inputs[0]).shape or ctx.type(y).shape != ctx.type(node.inputs[1]).shape:
        return None  # a constant that broadcast the operand: not a plain scale
    return {node.outputs[0]: ctx.emit("mul", ctx.emit("mul", x, y), ctx.emit("mul", c1, c2))}


@rewrite_rule("mul-over-add", roots=["mul"])
def distribute_scale(ctx: RewriteContext) -> Replacement | None:
    """(y + c1) · c2 is y · c2 + c1 · c2 when y comes from a linear primitive: the scale moves next to
    the linear primitive (where `scale-into-weight` can fold it) and the bias stays an addition."""
    chain = _constant_chain(ctx, "add")
    if chain is None:
        return None
    y, bias, scale = chain
    producer = ctx.producer(y)
    if producer is None or PRIMITIVES[producer.prim].kind != Kind.LINEAR:
        return None
    return {ctx.node.outputs[0]: ctx.emit("add", ctx.emit("mul", y, scale), ctx.emit("mul", bias, scale))}
