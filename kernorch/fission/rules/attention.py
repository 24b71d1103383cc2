"""Fission rule for the opset-23 Attention operator: scaled Q·Kᵀ, soft cap, bias (mask, causal and sliding
window), a softmax that leaves fully masked rows at zero, ·V. Grouped-query attention broadcasts each key/value
head over its query heads inside the matrix products instead of copying it. The causal and window masks
depend only on shapes, so they are constants."""

from __future__ import annotations

import numpy as np
import onnx

from kernorch.fission.registry import RuleContext, rule
from kernorch.fission.rules.common import reshape
from kernorch.ir.types import FLOAT_DTYPES

Q, K, V, MASK, PAST_KEY, PAST_VALUE, NONPAD = range(7)


def _heads_first(ctx: RuleContext, index: int, heads: int | None) -> str:
    """[B, S, H*D] → [B, H, S, D] for 3-D inputs; 4-D inputs are already [B, H, S, D]."""
    value_type = ctx.type(index)
    if value_type.rank == 4:
        return ctx.input(index)
    if heads is None or heads < 1 or value_type.shape[2] % heads:
        ctx.refuse("3-D inputs need q_num_heads and kv_num_heads dividing the hidden sizes")
    batch, seq, hidden = value_type.shape
    split = reshape(ctx, ctx.input(index), [batch, seq, heads, hidden // heads])
    return ctx.emit("transpose", split, perm=(0, 2, 1, 3))


def _static_bias(sq: int, skv: int, offset: int, causal: bool, left: int, right: int) -> np.ndarray | None:
    """0 where query i (at absolute position offset + i) may attend key j, -inf elsewhere; None if all may."""
    if not causal and left < 0 and right < 0:
        return None
    position = np.arange(sq)[:, None] + offset
    key = np.arange(skv)[None, :]
    allowed = np.ones((sq, skv), bool)
    if causal:
        allowed &= key <= position
    if left >= 0:
        allowed &= position - key <= left
    if right >= 0:
        allowed &= key - position <= right
    return np.where(allowed, 0.0, -np.inf)


@rule("Attention", min_opset=23)
def attention(ctx: RuleContext) -> list[str]:
    q_type = ctx.type(Q)
    dtype = q_type.dtype
    if dtype not in FLOAT_DTYPES or q_type.rank not in (3, 4) or any(ctx.type(i).rank != q_type.rank for i in (K, V)):
        ctx.refuse(f"needs float Q, K, V all 3-D or all 4-D, got {q_type}")
    if ctx.has_input(NONPAD) and ctx.has_input(PAST_KEY):
        ctx.refuse("nonpad_kv_seqlen cannot be combined with past_key/past_value")
    if ctx.has_input(PAST_KEY) != ctx.has_input(PAST_VALUE):
        ctx.refuse("past_key and past_value come together")
    q_heads, kv_heads = ctx.attr("q_num_heads"), ctx.attr("kv_num_heads")
    causal = bool(ctx.allow("is_causal", 0, 1, default=0))
    softcap = float(ctx.attr("softcap", 0.0))
    mode = ctx.allow("qk_matmul_output_mode", 0, 1, 2, 3, default=0)
    precision = ctx.attr("softmax_precision")
    left, right = int(ctx.attr("left_window_size", -1)), int(ctx.attr("right_window_size", -1))
    q = _heads_first(ctx, Q, q_heads)
    k = _heads_first(ctx, K, kv_heads)
    v = _heads_first(ctx, V, kv_heads)
    past = ctx.type(PAST_KEY).shape[2] if ctx.has_input(PAST_KEY) else 0
    if past:
        k = ctx.emit("concat", ctx.input(PAST_KEY), k, axis=2)
        v = ctx.emit("concat", ctx.input(PAST_VALUE), v, axis=2)
    batch, hq, sq, head = ctx.builder.type_of(q).shape
    _, hkv, skv, _ = ctx.builder.type_of(k).shape
    if hq % hkv or ctx.builder.type_of(v).shape[1] != hkv:
        ctx.refuse(f"{hq} query heads do not group over {hkv} key/value heads")
    groups = hq // hkv
    scale = ctx.attr("scale")
    root = float(np.sqrt(1.0 / np.sqrt(head) if scale is None else scale))
    factor = ctx.scalar(root, dtype)
    # [B, Hkv, groups*Sq, D] × [B, Hkv, D, Skv]: each key head meets its query heads in one product
    grouped_q = reshape(ctx, ctx.emit("mul", q, factor), [batch, hkv, groups * sq, head])
    keys_t = ctx.emit("transpose", ctx.emit("mul", k, factor), perm=(0, 1, 3, 2))
    scores = reshape(ctx, ctx.emit("matmul", grouped_q, keys_t), [batch, hq, sq, skv])
    if softcap > 0:
        cap = ctx.scalar(softcap, dtype)
        scores = ctx.emit("mul", ctx.emit("tanh", ctx.emit("div", scores, cap)), cap)
    raw_scores = scores
    window: str | None
    if ctx.has_input(NONPAD):  # an external cache: where the keys end, and so the causal frontier, is data
        window = _cache_bias(ctx, sq, skv, causal, left, right, dtype)
    else:
        static = _static_bias(sq, skv, past, causal, left, right)
        window = ctx.constant(static.astype(dtype), hint="attention_bias") if static is not None else None
    bias = _bias(ctx, skv, window, dtype)
    if bias is not None:
        scores = ctx.emit("add", scores, bias)
    biased_scores = scores
    if precision is not None:
        scores = ctx.emit("cast", scores, to=np.dtype(onnx.helper.tensor_dtype_to_np_dtype(precision)).name)
    probabilities = _softmax(ctx, scores, masked=bias is not None)
    if precision is not None:
        probabilities = ctx.emit("cast", probabilities, to=dtype)
    value_dim = ctx.builder.type_of(v).shape[3]
    grouped_p = reshape(ctx, probabilities, [batch, hkv, groups * sq, skv])
    y = reshape(ctx, ctx.emit("matmul", grouped_p, v), [batch, hq, sq, value_dim])
    if q_type.rank == 3:
        y = reshape(ctx, ctx.emit("transpose", y, perm=(0, 2, 1, 3)), [batch, sq, hq * value_dim])
    qk_output = {0: raw_scores, 1: raw_scores, 2: biased_scores, 3: probabilities}[mode]
    return [y, k, v, qk_output]


def _cache_bias(ctx: RuleContext, sq: int, skv: int, causal: bool, left: int, right: int, dtype: str) -> str:
    """With nonpad_kv_seqlen n[b]: key j is valid when j < n[b], and query i sits at n[b] - Sq + i."""
    lengths = reshape(ctx, ctx.input(NONPAD), [ctx.type(NONPAD).numel, 1, 1, 1])
    if ctx.type(NONPAD).dtype != "int64":
        lengths = ctx.emit("cast", lengths, to="int64")
    key = ctx.constant(np.arange(skv, dtype=np.int64).reshape(1, 1, 1, skv), hint="key_position")
    query = ctx.constant(np.arange(sq, dtype=np.int64).reshape(1, 1, sq, 1) - sq, hint="query_position")
    position = ctx.emit("add", query, lengths)
    allowed = ctx.emit("less", key, lengths)
    if causal:
        allowed = ctx.emit("and", allowed, ctx.emit("less_equal", key, position))
    if left >= 0:
        allowed = ctx.emit("and", allowed, ctx.emit("less_equal", ctx.emit("sub", position, key),
                                                    ctx.scalar(left, "int64")))  # fmt: skip
    if right >= 0:
        allowed = ctx.emit("and", allowed, ctx.emit("less_equal", ctx.emit("sub", key, position),
                                                    ctx.scalar(right, "int64")))  # fmt: skip
    return ctx.emit("where", allowed, ctx.scalar(0, dtype), ctx.scalar(-np.inf, dtype))


def _bias(ctx: RuleContext, skv: int, window: str | None, dtype: str) -> str | None:
    """The additive bias: the mask (bool → 0/-inf, padded with -inf up to the keys) plus the causal/window
    part."""
    if not ctx.has_input(MASK):
        return window
    mask = ctx.input(MASK)
    mask_type = ctx.type(MASK)
    if mask_type.dtype == "bool":
        mask = ctx.emit("where", mask, ctx.scalar(0, dtype), ctx.scalar(-np.inf, dtype))
    elif mask_type.dtype != dtype:
        ctx.refuse(f"attn_mask dtype {mask_type.dtype} differs from Q's {dtype}")
    shortfall = skv - mask_type.shape[-1]
    if shortfall < 0:
        ctx.refuse(f"attn_mask covers {mask_type.shape[-1]} keys, more than the {skv} there are")
    if shortfall:
        pads = [0] * (2 * mask_type.rank)
        pads[2 * mask_type.rank - 1] = shortfall
        mask = ctx.emit("pad", mask, pads=tuple(pads), mode="constant", value=float("-inf"))
    return ctx.emit("add", mask, window) if window is not None else mask


def _softmax(ctx: RuleContext, scores: str, masked: bool) -> str:
    """Softmax over keys; with a bias, a row masked everywhere gives zeros (its max is -inf: subtract 0
    instead, and divide the all-zero row by 1)."""
    dtype = ctx.builder.type_of(scores).dtype
    peak = ctx.emit("reduce_max", scores, axes=(3,))
    if masked:
        peak = ctx.emit("where", ctx.emit("equal", peak, ctx.scalar(-np.inf, dtype)), ctx.scalar(0, dtype), peak)
    exponentials = ctx.emit("exp", ctx.emit("sub", scores, peak))
    total = ctx.emit("reduce_sum", exponentials, axes=(3,))
    if masked:
        zero = ctx.emit("equal", total, ctx.scalar(0, dtype))
        total = ctx.emit("where", zero, ctx.scalar(1, dtype), total)
    return ctx.emit("div", exponentials, total)
