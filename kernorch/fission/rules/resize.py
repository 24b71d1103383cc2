"""Fission rule for Resize: one `resize` layout primitive with every attribute resolved."""

from __future__ import annotations

import numpy as np

from kernorch.fission.registry import RuleContext, rule
from kernorch.ir.types import FLOAT_DTYPES


@rule("Resize", static_inputs=(1, 2, 3), min_opset=11)
def resize(ctx: RuleContext) -> list[str]:
    x_type = ctx.type(0)
    rank = x_type.rank
    mode = ctx.allow("mode", "nearest", "linear", "cubic", default="nearest")
    # nearest moves values, whatever their type (a QOperator model resizes its uint8 activations); the
    # interpolating modes compute in float
    if x_type.dtype not in FLOAT_DTYPES and (mode != "nearest" or x_type.dtype == "bool"):
        ctx.refuse(f"dtype {x_type.dtype} is supported in nearest mode only")
    coordinate_mode = ctx.allow(
        "coordinate_transformation_mode",
        "half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "half_pixel_symmetric",
        default="half_pixel",
    )  # fmt: skip
    nearest_mode = ctx.allow("nearest_mode", "round_prefer_floor", "round_prefer_ceil", "floor", "ceil",
                             default="round_prefer_floor")  # fmt: skip
    cubic_coeff_a = float(ctx.attr("cubic_coeff_a", -0.75))
    exclude_outside = bool(ctx.attr("exclude_outside", 0))
    ctx.attr("extrapolation_value")  # only used by tf_crop_and_resize, which is refused above
    policy = ctx.allow("keep_aspect_ratio_policy", "stretch", "not_larger", "not_smaller", default="stretch")
    # opset 18: antialiasing stretches the linear and cubic filters by 1/scale where an axis shrinks, and changes
    # nothing where none shrinks (torch.onnx's dynamo exporter writes antialias=0 always); onnxruntime refuses it
    # in nearest mode, and so does kernorch
    antialias = ctx.allow("antialias", 0, 1, default=0)
    axes_attr = ctx.attr("axes", None)
    axes = list(range(rank)) if axes_attr is None else [ctx.normalize_axis(a, rank, "axes") for a in axes_attr]

    scales_value = ctx.optional_const(2, "scales")
    sizes_value = ctx.optional_const(3, "sizes")
    if scales_value is not None and scales_value.size == 0:
        scales_value = None
    if sizes_value is not None and sizes_value.size == 0:
        sizes_value = None
    if (scales_value is None) == (sizes_value is None):
        ctx.refuse("exactly one of scales and sizes must be given")
    scales = [1.0] * rank
    sizes = list(x_type.shape)
    if scales_value is not None:
        if scales_value.size != len(axes):
            ctx.refuse("scales length does not match the axes")
        for axis, scale in zip(axes, scales_value.reshape(-1).tolist(), strict=True):
            if scale <= 0:
                ctx.refuse(f"non-positive scale {scale}")
            scales[axis] = float(scale)
            sizes[axis] = int(np.floor(x_type.shape[axis] * np.float32(scale)))
    else:
        assert sizes_value is not None
        if sizes_value.size != len(axes):
            ctx.refuse("sizes length does not match the axes")
        requested = dict(zip(axes, sizes_value.reshape(-1).tolist(), strict=True))
        if policy == "stretch":
            for axis, size in requested.items():
                sizes[axis] = int(size)
                scales[axis] = size / x_type.shape[axis]
        else:
            # One scale for every resized axis: the largest that fits (not_larger) or the smallest that covers.
            ratios = [size / x_type.shape[axis] for axis, size in requested.items()]
            scale = min(ratios) if policy == "not_larger" else max(ratios)
            for axis in requested:
                sizes[axis] = int(scale * x_type.shape[axis] + 0.5)
                scales[axis] = scale
    if antialias and mode == "nearest":
        ctx.refuse("antialias applies to linear and cubic modes only", "antialias")
    if antialias and any(scale < 1 for scale in scales):
        ctx.refuse(f"antialiased {mode} downscaling is not supported", "antialias")
    return [ctx.emit("resize", ctx.input(0), sizes=tuple(sizes), scales=tuple(scales), mode=mode,
                     coordinate_mode=coordinate_mode, nearest_mode=nearest_mode, cubic_coeff_a=cubic_coeff_a,
                     exclude_outside=exclude_outside)]  # fmt: skip


@rule("Upsample", static_inputs=(1,), min_opset=7)
def upsample(ctx: RuleContext) -> list[str]:
    """Deprecated Upsample (opsets 7-9): Resize by scales, asymmetric coordinates, nearest rounding down."""
    x_type = ctx.type(0)
    if x_type.dtype not in FLOAT_DTYPES:
        ctx.refuse(f"dtype {x_type.dtype} is not supported")
    mode = ctx.allow("mode", "nearest", "linear", "bilinear", default="nearest")
    scales = [float(v) for v in (ctx.attr("scales") if ctx.opset < 9 else ctx.const(1, "scales").reshape(-1))]
    if len(scales) != x_type.rank or min(scales) < 1:
        ctx.refuse(f"needs one scale >= 1 per axis, got {scales}", "scales")
    sizes = tuple(int(np.floor(d * s)) for d, s in zip(x_type.shape, scales, strict=True))
    return [ctx.emit("resize", ctx.input(0), sizes=sizes, scales=tuple(scales),
                     mode="nearest" if mode == "nearest" else "linear", coordinate_mode="asymmetric",
                     nearest_mode="floor", cubic_coeff_a=-0.75, exclude_outside=False)]  # fmt: skip
