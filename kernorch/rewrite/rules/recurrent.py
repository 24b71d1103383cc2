"""Recurrences as waves (Rammer's LSTM-TC case): stacked LSTM layers become one `lstm_stack`.

Fission leaves each ONNX LSTM as an input projection (one matmul over all steps) and a scan, so a stack of
layers runs layer after layer, each scan spread over every thread with a barrier per step. As one
`lstm_stack` the layers run as waves instead: a layer's steps are cut into chunks, a (layer, chunk) is an rTask
on the thread that owns the layer, and layer l+1 works on chunk c while layer l works on chunk c+1
(codegen/native/lstm_stack.py). Whether that is faster depends on the machine: with few cores and large layers
the split scan, which keeps each core's share of the recurrent weights in its L2, wins. So the rule is
cost-guided: a merge is kept only where the measured (or estimated) plan gets cheaper.
"""

from __future__ import annotations

import numpy as np

from kernorch.ir import reference_kernels as K
from kernorch.ir.graph import Node
from kernorch.rewrite.engine import Replacement, RewriteContext, rewrite_rule


# Not a follow-up: each merge creates a stack that enables the next (the layer below joins it), so as follow-ups
# one judged merge would pull the whole stack in unjudged.
@rewrite_rule("lstm-layers-as-waves", roots=["lstm_recurrence", "lstm_stack"], cost_guided=True, follow_up=False)
def lstm_layers_as_waves(ctx: RewriteContext) -> Replacement | None:
    """A forward LSTM layer (or stack) whose input projection reads only the Y of the forward layer (or stack)
    below it joins it in one lstm_stack, run as waves of (layer, steps) rTasks."""
    node = ctx.node
    gates = node.inputs[0]
    dirs, seq, batch, four_h = ctx.type(gates).shape
    if not _forward(node) or dirs != 1 or four_h % K.PANEL:
        return None
    projection = _projection(ctx, gates, seq * batch, four_h)
    if projection is None:
        return None
    rows, weights, bias = projection
    below = _layer_below(ctx, rows, seq, batch)
    if below is None or ctx.type(weights).shape[-2:] != (ctx.type(below.outputs[0]).shape[-1], four_h):
        return None
    features = ctx.type(weights).shape[-2]
    panels = ctx.emit("transpose", ctx.emit("reshape", weights, shape=(features, four_h // K.PANEL, K.PANEL)),
                      perm=(1, 0, 2))  # fmt: skip
    dtype = ctx.type(gates).dtype
    bias_row = ctx.emit("reshape", bias, shape=(four_h,)) if bias else ctx.constant(np.zeros(four_h, dtype))
    outputs = ctx.emit_all("lstm_stack", [*below.inputs, panels, bias_row, *node.inputs[1:]],
                           unit_blocks=(*_unit_blocks(below), *_unit_blocks(node)))  # fmt: skip
    return dict(zip(node.outputs, outputs, strict=True))


def _forward(node: Node) -> bool:
    """A stack is always forward; a single layer when its direction says so."""
    return node.prim == "lstm_stack" or node.attr("direction") == "forward"


def _unit_blocks(node: Node) -> tuple[int, ...]:
    return (node.attr("unit_block"),) if node.prim == "lstm_recurrence" else tuple(node.attr("unit_blocks"))


def _projection(ctx: RewriteContext, gates: str, rows: int, four_h: int) -> tuple[str, str, str | None] | None:
    """(rows operand, weights, bias or None) when `gates` is reshape(rows @ weights [+ bias]) computed for this
    layer alone: the product [1?, rows, 4H], the bias a [.., 4H] row."""
    reshaped = ctx.producer(gates)
    if reshaped is None or reshaped.prim != "reshape" or not ctx.single_use(gates):
        return None
    ctx.absorb(gates)
    value, bias = reshaped.inputs[0], None
    producer = ctx.producer(value)
    if producer is not None and producer.prim == "add" and ctx.single_use(value):
        ctx.absorb(value)
        for product, other in (producer.inputs, producer.inputs[::-1]):
            found = ctx.producer(product)
            other_type = ctx.type(other)
            if found is not None and found.prim == "matmul" and other_type.numel == four_h \
                    and other_type.shape[-1] == four_h:  # fmt: skip
                value, bias, producer = product, other, found
                break
        else:
            return None
    if producer is None or producer.prim != "matmul" or not ctx.single_use(value):
        return None
    ctx.absorb(value)
    operand, weights = producer.inputs
    out_shape, weight_shape = ctx.type(value).shape, ctx.type(weights).shape
    if out_shape[-2:] != (rows, four_h) or any(d != 1 for d in out_shape[:-2]) \
            or any(d != 1 for d in weight_shape[:-2]):  # fmt: skip
        return None
    return operand, weights, bias


def _layer_below(ctx: RewriteContext, rows: str, seq: int, batch: int) -> Node | None:
    """The forward lstm_recurrence or lstm_stack whose Y, reshaped to rows, is `rows`, when nothing else uses
    its Y and its Y_h and Y_c are not used at all (the stack does not keep a lower layer's outputs)."""
    reshaped = ctx.producer(rows)
    if reshaped is None or reshaped.prim != "reshape" or not ctx.single_use(rows):
        return None
    ctx.absorb(rows)
    ys = reshaped.inputs[0]
    below = ctx.producer(ys)
    if below is None or below.prim not in ("lstm_recurrence", "lstm_stack") or not _forward(below) \
            or not ctx.single_use(ys):  # fmt: skip
        return None
    if ctx.type(ys).shape[:3] != (seq, 1, batch) or any(ctx.consumers(v) or ctx.is_output(v)
                                                        for v in below.outputs[1:]):  # fmt: skip
        return None
    ctx.absorb(ys)
    return below
