"""Fission rule for LSTM: the input projection becomes linear primitives, the scan stays opaque.

Why not unroll: the shared LSTM-TC model has 10 layers × 100 steps; unrolling gives ~15 000
primitives whose sequential chain offers orchestration nothing to fuse across steps but explodes the
state enumeration. Splitting off X·Wᵀ (one large matmul over all time steps, plus its bias) keeps the
compute-heavy, parallel part visible to orchestration; the recurrence is one `lstm_recurrence`.

The recurrent weights are handed to the scan packed for it (folded at compile time when they are constant):
per block of `unit_block` hidden units, the four gates' columns of Rᵀ side by side, one contiguous panel
[H, 4, unit_block] per block. A thread computing a block's gates then reads one contiguous stretch of memory
per step. With Rᵀ as one [H, 4H] matrix, each thread's half of every row sat at the same offset of each 1 KB,
so it mapped onto half of the L2's sets and missed the cache every step (9.2 vs 5.5 µs per step, H=256).
"""

from __future__ import annotations

import numpy as np

from kernorch.fission.registry import RuleContext, rule
from kernorch.fission.rules.common import reshape

_DEFAULT_ACTIVATIONS = ["Sigmoid", "Tanh", "Tanh"]


@rule("LSTM", static_inputs=(4,))
def lstm(ctx: RuleContext) -> list[str]:
    x_type, w_type = ctx.type(0), ctx.type(1)
    if x_type.dtype not in ("float32", "float64"):
        ctx.refuse(f"dtype {x_type.dtype} is not supported")
    direction = ctx.allow("direction", "forward", "reverse", "bidirectional", default="forward")
    dirs = 2 if direction == "bidirectional" else 1
    hidden = ctx.attr("hidden_size", None)
    activations = ctx.attr("activations", None)
    if activations is not None and list(activations) != _DEFAULT_ACTIVATIONS * dirs:
        ctx.refuse(f"activations {activations} (only the default sigmoid/tanh/tanh)", "activations")
    for name in ("activation_alpha", "activation_beta", "clip"):
        if ctx.has_attr(name):
            ctx.refuse("not supported", name)
    ctx.allow("input_forget", 0, default=0)
    ctx.allow("layout", 0, default=0)
    seq, batch, features = x_type.shape
    four_h = w_type.shape[1]
    hidden = hidden or four_h // 4
    if w_type.shape != (dirs, 4 * hidden, features):
        ctx.refuse(f"W shape {w_type.shape} does not match direction/hidden_size")
    if ctx.has_input(4):
        lengths = ctx.const(4, "sequence_lens")
        if np.any(lengths != seq):
            ctx.refuse("variable sequence lengths are not supported")

    # Input projection for all steps at once: [1, seq*batch, I] @ [dirs, I, 4H] -> [dirs, seq*batch, 4H].
    flat_x = reshape(ctx, ctx.input(0), [1, seq * batch, features])
    w_t = ctx.emit("transpose", ctx.input(1), perm=(0, 2, 1))
    gates = ctx.emit("matmul", flat_x, w_t)
    if ctx.has_input(3):
        bias = ctx.input(3)  # [dirs, 8H] = Wb ‖ Rb
        w_bias, r_bias = ctx.emit_multi("split", [bias], axis=1, sizes=(4 * hidden, 4 * hidden))
        gates = ctx.emit("add", gates, reshape(ctx, ctx.emit("add", w_bias, r_bias), [dirs, 1, 4 * hidden]))
    gates = reshape(ctx, gates, [dirs, seq, batch, 4 * hidden])

    state_shape = (dirs, batch, hidden)
    zeros = np.zeros(state_shape, dtype=x_type.dtype)
    h0 = ctx.input(5) if ctx.has_input(5) else ctx.constant(zeros, hint="h0")
    c0 = ctx.input(6) if ctx.has_input(6) else ctx.constant(zeros, hint="c0")
    peephole = ctx.input(7) if ctx.has_input(7) else ctx.constant(np.zeros((dirs, 3 * hidden), x_type.dtype),
                                                                  hint="peephole")  # fmt: skip
    block = unit_block(hidden)
    # R [D, 4H, H] = [D, gate, unit block, unit in block, k] → panels [D, unit block, k, gate, unit in block]
    blocks = reshape(ctx, ctx.input(2), [dirs, 4, hidden // block, block, hidden])
    packed = ctx.emit("transpose", blocks, perm=(0, 2, 4, 1, 3))
    return ctx.emit_multi("lstm_recurrence", [gates, packed, h0, c0, peephole], direction=direction,
                          unit_block=block)  # fmt: skip


def unit_block(hidden: int) -> int:
    """Hidden units per block of the packed recurrent weights: 16 (one AVX-512 vector per gate) when it divides
    the hidden size, else the largest power of two that does."""
    return next(b for b in (16, 8, 4, 2, 1) if hidden % b == 0)
