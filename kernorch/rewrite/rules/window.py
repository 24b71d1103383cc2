"""Rules for sliding windows: a max or sum pool over several axes becomes one pool per axis.

max and Σ are separable: the max (sum) over a kh × kw window is the max (sum) over kh rows of each row's max
(sum) over kw columns, padding included (it never wins a max and adds 0 to a sum), per-axis strides, dilations
and ceil mode too, since a window's extent along each axis depends on that axis alone. One pass over all
kh·kw taps reads each input kh·kw times per output; one pass per axis reads it kh + kw times, and the
outermost axis's pass reads whole rows, which vectorize (shufflenet_v2's stem pool, 3x3/2 over 24
channels-last channels, ran at 3.9x its roofline in one pass). The cost model decides whether the
intermediate pays off, except for a small unstrided window (every axis at most 3 wide, stride 1: the token mixers
of PoolFormer-like models, inception's 3x3/1 branch pools), which stays one pass: it saves 3 of 9 additions per
output and costs an intermediate that is hot in cache when profiled alone but cold in place (efficientformer_l1's
twelve 3x3/1 pools took 0.80 ms separated and 0.45 ms whole in place, googlenet's 0.11 and 0.09 ms), so the
isolated profiles that guide the rule choose it where it loses.
"""

from __future__ import annotations

from kernorch.rewrite.engine import Replacement, RewriteContext, rewrite_rule

SMALL_WINDOW = 3  # widest axis of an unstrided window kept in one pass


@rewrite_rule("separate-window-axes", roots=["window_max", "window_sum"], cost_guided=True)
def separate_window_axes(ctx: RewriteContext) -> Replacement | None:
    """window(x) over spatial axes a < b (kernel > 1 on both) is window_b(window_a(x)): the outermost axis
    first, so the first pass reads whole rows and the second works on fewer of them. Not for a small unstrided
    window (the module's docstring says why)."""
    attrs = ctx.node.attr_dict
    kernel, strides, pads, dilations = attrs["kernel"], attrs["strides"], attrs["pads"], attrs["dilations"]
    spatial = len(kernel)
    axes = [i for i in range(spatial) if kernel[i] > 1]
    if len(axes) < 2 or all(kernel[i] <= SMALL_WINDOW and strides[i] == 1 for i in axes):
        return None
    value = ctx.node.inputs[0]
    for axis in axes:
        one_axis = {**attrs, "kernel": _along(kernel, axis, 1), "strides": _along(strides, axis, 1),
                    "dilations": _along(dilations, axis, 1),
                    "pads": _along(pads[:spatial], axis, 0) + _along(pads[spatial:], axis, 0)}  # fmt: skip
        value = ctx.emit(ctx.node.prim, value, **one_axis)
    return {ctx.node.outputs[0]: value}


def _along(values: tuple[int, ...], axis: int, other: int) -> tuple[int, ...]:
    """`values` at `axis`, `other` (no window) everywhere else."""
    return tuple(v if i == axis else other for i, v in enumerate(values))
