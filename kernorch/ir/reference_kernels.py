"""Reference implementations of the primitives that take more than a numpy one-liner.

These are the executable specification: plain, readable numpy/torch, not fast. Every later stage
(rewrites, generated C, library calls) is tested against them.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING, TypeVar

import numpy as np

from kernorch.errors import NeedsTorch

if TYPE_CHECKING:
    import torch

# torch is imported on first use only: a loaded plan whose kernels are all generated code runs without it.


def torch_module() -> ModuleType:
    """torch, or NeedsTorch in one line when it is not installed."""
    try:
        import torch
    except ImportError:
        raise NeedsTorch("the reference implementation of this primitive (what `kernorch check` and kernels no "
                         "backend generates run) needs PyTorch: pip install 'kernorch[torch]'") from None
    return torch


def _functional() -> ModuleType:
    return torch_module().nn.functional  # type: ignore[no-any-return]


def to_torch(array: np.ndarray) -> torch.Tensor:
    contiguous = np.asarray(array, order="C")
    # torch refuses read-only buffers (e.g. broadcast views); those are copied.
    return torch_module().from_numpy(contiguous if contiguous.flags.writeable else contiguous.copy())


def broadcast_matmul_shape(a: Sequence[int], b: Sequence[int]) -> tuple[int, ...]:
    """ONNX/numpy MatMul output shape, including the 1-D promotion rules."""
    a_shape, b_shape = list(a), list(b)
    squeeze_a = len(a_shape) == 1
    squeeze_b = len(b_shape) == 1
    if squeeze_a:
        a_shape = [1, *a_shape]
    if squeeze_b:
        b_shape = [*b_shape, 1]
    if a_shape[-1] != b_shape[-2]:
        raise ValueError(f"matmul inner dims differ: {a} @ {b}")
    batch = np.broadcast_shapes(tuple(a_shape[:-2]), tuple(b_shape[:-2]))
    out = [*batch, a_shape[-2], b_shape[-1]]
    if squeeze_b:
        out.pop(-1)
    if squeeze_a:
        out.pop(-2 if not squeeze_b else -1)
    return tuple(int(d) for d in out)


def round_to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to the nearest bfloat16 (ties to even), kept as float32: what a linear primitive with
    `precision="bf16"` multiplies (its sums stay float32). bfloat16 is float32's top 16 bits, so rounding adds
    0x7FFF plus the lowest kept bit and clears the low half; NaN stays NaN (the addition could carry it into inf),
    and values beyond bfloat16's largest finite round to inf, as oneDNN's conversion does."""
    bits = np.asarray(x, dtype=np.float32, order="C").view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    result = rounded.view(np.float32)
    return np.where(np.isnan(x), np.float32(np.nan), result).astype(np.float32)


def matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype.kind == "f" and a.dtype == b.dtype and a.dtype != np.float16:
        return torch_module().matmul(to_torch(a), to_torch(b)).numpy()  # type: ignore[no-any-return]
    return np.matmul(a, b)


def matmul_integer(a: np.ndarray, b: np.ndarray, a_zero: np.ndarray, b_zero: np.ndarray) -> np.ndarray:
    """(a - a_zero) @ (b - b_zero) of 8-bit integers, int32 sums. In float64, exactly: each product is at most
    255², each partial sum an integer below 2^31 (primitives.MAX_INTEGER_K), far inside float64's 2^53."""
    left = a.astype(np.float64) - a_zero.astype(np.float64)
    right = b.astype(np.float64) - b_zero.astype(np.float64)
    return np.matmul(left, right).astype(np.int32)


def conv_output_shape(
    x: Sequence[int], w: Sequence[int], strides: Sequence[int], pads: Sequence[int],
    dilations: Sequence[int], group: int,
) -> tuple[int, ...]:  # fmt: skip
    spatial = len(x) - 2
    if w[1] * group != x[1] or w[0] % group:
        raise ValueError(f"conv channels mismatch: x {tuple(x)}, w {tuple(w)}, group {group}")
    out = [x[0], w[0]]
    for i in range(spatial):
        extent = x[2 + i] + pads[i] + pads[spatial + i] - dilations[i] * (w[2 + i] - 1) - 1
        if extent < 0:
            raise ValueError("conv window larger than padded input")
        out.append(extent // strides[i] + 1)
    return tuple(out)


_CONV = {1: "conv1d", 2: "conv2d", 3: "conv3d"}
_CONV_T = {1: "conv_transpose1d", 2: "conv_transpose2d", 3: "conv_transpose3d"}


def _torch_pad_spec(pads: Sequence[int], spatial: int) -> list[int]:
    # torch pads the last dim first: (last_begin, last_end, second-last_begin, ...)
    spec: list[int] = []
    for i in reversed(range(spatial)):
        spec += [pads[i], pads[spatial + i]]
    return spec


def conv(
    x: np.ndarray, w: np.ndarray, strides: Sequence[int], pads: Sequence[int],
    dilations: Sequence[int], group: int,
) -> np.ndarray:  # fmt: skip
    spatial = x.ndim - 2
    if spatial not in _CONV or x.dtype != np.float32 and x.dtype != np.float64:
        raise NotImplementedError(f"conv reference: {spatial}-d {x.dtype}")
    F = _functional()  # noqa: N806 - torch's own name for it
    tx = F.pad(to_torch(x), _torch_pad_spec(pads, spatial)) if any(pads) else to_torch(x)
    result = getattr(F, _CONV[spatial])(tx, to_torch(w), None, tuple(strides), 0, tuple(dilations), group)
    return result.numpy()  # type: ignore[no-any-return]


def conv_transpose_output_shape(
    x: Sequence[int], w: Sequence[int], strides: Sequence[int], pads: Sequence[int],
    dilations: Sequence[int], group: int, output_padding: Sequence[int],
) -> tuple[int, ...]:  # fmt: skip
    spatial = len(x) - 2
    if w[0] != x[1]:
        raise ValueError(f"conv_transpose channels mismatch: x {tuple(x)}, w {tuple(w)}")
    out = [x[0], w[1] * group]
    for i in range(spatial):
        full = strides[i] * (x[2 + i] - 1) + output_padding[i] + (w[2 + i] - 1) * dilations[i] + 1
        out.append(full - pads[i] - pads[spatial + i])
    return tuple(out)


def conv_transpose(
    x: np.ndarray, w: np.ndarray, strides: Sequence[int], pads: Sequence[int],
    dilations: Sequence[int], group: int, output_padding: Sequence[int],
) -> np.ndarray:  # fmt: skip
    spatial = x.ndim - 2
    if spatial not in _CONV_T:
        raise NotImplementedError(f"conv_transpose reference: {spatial}-d")
    # Compute the unpadded ("full") result, then crop the pads: torch only pads symmetrically.
    full = getattr(_functional(), _CONV_T[spatial])(
        to_torch(x), to_torch(w), None, tuple(strides), 0, tuple(output_padding), group, tuple(dilations)
    ).numpy()
    crop = tuple(
        slice(pads[i], full.shape[2 + i] - pads[spatial + i]) for i in range(spatial)
    )
    return np.asarray(full[(slice(None), slice(None), *crop)], order="C")


def window_output_size(size: int, kernel: int, stride: int, pad_begin: int, pad_end: int,
                       dilation: int, ceil_mode: bool) -> int:  # fmt: skip
    span = dilation * (kernel - 1) + 1
    extent = size + pad_begin + pad_end - span
    out = (-(-extent // stride) if ceil_mode else extent // stride) + 1
    # A window may not start in the end padding (the rule PyTorch and onnxruntime use for ceil mode).
    if ceil_mode and (out - 1) * stride >= size + pad_begin:
        out -= 1
    return max(out, 0)


def window_reduce(
    x: np.ndarray, reducer: str, kernel: Sequence[int], strides: Sequence[int], pads: Sequence[int],
    dilations: Sequence[int], ceil_mode: bool,
) -> np.ndarray:  # fmt: skip
    """Sliding-window max or sum over the trailing len(kernel) axes; padding never wins a max."""
    spatial = len(kernel)
    lead = x.ndim - spatial
    fill = -np.inf if reducer == "max" else 0
    if reducer == "max" and x.dtype.kind != "f":
        fill = np.iinfo(x.dtype).min
    out_sizes = [
        window_output_size(x.shape[lead + i], kernel[i], strides[i], pads[i], pads[spatial + i],
                           dilations[i], ceil_mode)
        for i in range(spatial)
    ]  # fmt: skip
    pad_width = [(0, 0)] * lead
    for i in range(spatial):
        needed = (out_sizes[i] - 1) * strides[i] + dilations[i] * (kernel[i] - 1) + 1
        end = max(needed - x.shape[lead + i] - pads[i], 0)
        pad_width.append((pads[i], end))
    padded = np.pad(x, pad_width, constant_values=fill)
    windows = np.lib.stride_tricks.sliding_window_view(
        padded, [dilations[i] * (kernel[i] - 1) + 1 for i in range(spatial)], axis=tuple(range(lead, x.ndim))
    )
    index = [slice(None)] * lead
    index += [slice(0, (out_sizes[i] - 1) * strides[i] + 1, strides[i]) for i in range(spatial)]
    index += [slice(None, None, dilations[i]) for i in range(spatial)]
    windows = windows[tuple(index)]
    axes = tuple(range(x.ndim, x.ndim + spatial))
    result = windows.max(axis=axes) if reducer == "max" else windows.sum(axis=axes, dtype=x.dtype)
    return np.asarray(result.astype(x.dtype, copy=False), order="C")


# ---------------------------------------------------------------------------------------------- resize

def _source_coordinates(out_size: int, in_size: int, scale: float, mode: str) -> np.ndarray:
    """Input coordinate of every output index, per ONNX Resize coordinate_transformation_mode."""
    x = np.arange(out_size, dtype=np.float64)
    if mode == "half_pixel":
        return (x + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return (x + 0.5) / scale - 0.5 if out_size > 1 else np.zeros_like(x)
    if mode == "align_corners":
        # ONNX divides by the unrounded output length in_size * scale, not by the integer size (onnxruntime
        # divides by the size). A length within float32 rounding of the size (sizes given, or a scale read
        # back from float32) is the size: both agree there, and a grid point then falls exactly on its input,
        # reading the same taps as onnxruntime's.
        length = in_size * scale
        if abs(length - out_size) <= 1e-6 * out_size:
            length = out_size
        return x * (in_size - 1) / (length - 1) if length != 1 else np.zeros_like(x)
    if mode == "asymmetric":
        return x / scale
    if mode == "half_pixel_symmetric":
        adjustment = out_size / (scale * in_size)
        center = in_size / 2
        offset = center * (1 - adjustment)
        return offset + (x + 0.5) / scale - 0.5
    raise NotImplementedError(mode)


def _nearest_index(coords: np.ndarray, nearest_mode: str) -> np.ndarray:
    if nearest_mode == "round_prefer_floor":
        return np.where(coords - np.floor(coords) == 0.5, np.floor(coords), np.round(coords))
    if nearest_mode == "round_prefer_ceil":
        return np.where(coords - np.floor(coords) == 0.5, np.ceil(coords), np.round(coords))
    if nearest_mode == "floor":
        return np.floor(coords)
    if nearest_mode == "ceil":
        return np.ceil(coords)
    raise NotImplementedError(nearest_mode)


def _cubic_weights(t: np.ndarray, a: float) -> np.ndarray:
    """Keys cubic convolution weights for taps at offsets -1, 0, 1, 2 from floor(coord)."""
    def kernel(d: np.ndarray) -> np.ndarray:
        d = np.abs(d)
        return np.where(
            d <= 1, ((a + 2) * d - (a + 3)) * d * d + 1,
            np.where(d < 2, ((a * d - 5 * a) * d + 8 * a) * d - 4 * a, 0.0),
        )  # fmt: skip
    return np.stack([kernel(t + 1), kernel(t), kernel(1 - t), kernel(2 - t)], axis=-1)


def resize_axis(
    x: np.ndarray, axis: int, out_size: int, scale: float, mode: str, coordinate_mode: str,
    nearest_mode: str, cubic_coeff_a: float, exclude_outside: bool,
) -> np.ndarray:  # fmt: skip
    """Resize along one axis; N-d linear/cubic resize is separable, so axes are done one at a time."""
    in_size = x.shape[axis]
    if out_size == in_size and scale == 1.0:
        return x
    taps, weights = axis_taps(in_size, out_size, scale, mode, coordinate_mode, nearest_mode, cubic_coeff_a,
                              exclude_outside)  # fmt: skip
    if mode == "nearest":
        return np.take(x, taps[:, 0], axis=axis)
    moved = np.moveaxis(x, axis, -1).astype(np.float64)
    gathered = moved[..., taps]  # (..., out, taps)
    result = (gathered * weights).sum(axis=-1)
    return np.moveaxis(result, -1, axis).astype(x.dtype)


def axis_taps(in_size: int, out_size: int, scale: float, mode: str, coordinate_mode: str, nearest_mode: str,
              cubic_coeff_a: float, exclude_outside: bool) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """Per output position along one axis, the input positions it reads (clamped to the axis) and their float64
    weights: [out_size, 1] for nearest, 2 for linear, 4 for cubic. Linear in the sizes (never out × in).
    Every tap is read, a zero weight included, as onnxruntime reads them: 0 · NaN is NaN, so which outputs a NaN
    or an inf reaches depends on the taps, not only on the weights."""
    coords = _source_coordinates(out_size, in_size, scale, coordinate_mode)
    if mode == "nearest":
        index = np.clip(_nearest_index(coords, nearest_mode).astype(np.int64), 0, in_size - 1)
        return index[:, None], np.ones((out_size, 1))
    base = np.floor(coords).astype(np.int64)
    frac = coords - base
    if mode == "linear":
        # Coordinates outside the input clamp to its edge (onnxruntime and the ONNX reference agree).
        coords = np.clip(coords, 0, in_size - 1)
        base = np.floor(coords).astype(np.int64)
        offsets = np.array([0, 1])
        weights = np.stack([1 - (coords - base), coords - base], axis=-1)
    elif mode == "cubic":
        offsets = np.array([-1, 0, 1, 2])
        weights = _cubic_weights(frac, cubic_coeff_a)
    else:
        raise NotImplementedError(mode)
    taps = base[:, None] + offsets[None, :]
    if exclude_outside:
        weights = np.where((taps >= 0) & (taps < in_size), weights, 0.0)
        weights = weights / weights.sum(axis=1, keepdims=True)
    taps = np.clip(taps, 0, in_size - 1)
    if mode == "linear":
        # onnxruntime weights a pair clamped to one position (the axis' last, or an axis of one) half and half:
        # an inf there stays inf, where 1·inf + 0·inf would be NaN.
        weights[taps[:, 0] == taps[:, 1]] = 0.5
    return taps, weights


def resize(x: np.ndarray, sizes: Sequence[int], scales: Sequence[float], mode: str, coordinate_mode: str,
           nearest_mode: str, cubic_coeff_a: float, exclude_outside: bool) -> np.ndarray:  # fmt: skip
    result = x
    for axis in range(x.ndim):
        result = resize_axis(result, axis, sizes[axis], scales[axis], mode, coordinate_mode, nearest_mode,
                             cubic_coeff_a, exclude_outside)  # fmt: skip
    return np.asarray(result, order="C")


# ------------------------------------------------------------------------------------------------ lstm

def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def lstm_recurrence(
    gates_x: np.ndarray, recurrence: np.ndarray, h0: np.ndarray, c0: np.ndarray, peephole: np.ndarray,
    direction: str,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
    """The sequential part of ONNX LSTM (gate order i, o, f, c; default activations).

    gates_x: [dirs, seq, batch, 4H] = X·Wᵀ + Wb + Rb, precomputed as one linear primitive.
    recurrence: R [dirs, 4H, H] packed as [dirs, H/block, H, 4, block] (fission/rules/recurrent.py);
    h0, c0: [dirs, batch, H]; peephole: [dirs, 3H] (i, o, f).
    Returns Y [seq, dirs, batch, H], Y_h and Y_c [dirs, batch, H].
    """
    dirs, seq, batch, four_h = gates_x.shape
    hidden = four_h // 4
    recurrence = recurrence.transpose(0, 3, 1, 4, 2).reshape(dirs, four_h, hidden)  # back to R
    ys = np.zeros((seq, dirs, batch, hidden), dtype=gates_x.dtype)
    last_h = np.zeros((dirs, batch, hidden), dtype=gates_x.dtype)
    last_c = np.zeros_like(last_h)
    for d in range(dirs):
        reverse = direction == "reverse" or (direction == "bidirectional" and d == 1)
        h, c = h0[d], c0[d]
        p_i, p_o, p_f = np.split(peephole[d], 3)
        for step in range(seq):
            t = seq - 1 - step if reverse else step
            gates = gates_x[d, t] + h @ recurrence[d].T
            g_i, g_o, g_f, g_c = np.split(gates, 4, axis=-1)
            i = _sigmoid(g_i + p_i * c)
            f = _sigmoid(g_f + p_f * c)
            candidate = np.tanh(g_c)
            c = f * c + i * candidate
            o = _sigmoid(g_o + p_o * c)
            h = o * np.tanh(c)
            ys[t, d] = h
        last_h[d], last_c[d] = h, c
    return ys, last_h, last_c


PANEL = 16  # output columns per panel of a stacked layer's packed input weights (lstm_stack)
_T = TypeVar("_T")


def stack_layers(inputs: Sequence[_T]) -> list[Sequence[_T]]:
    """lstm_stack's inputs per layer: the first layer's five (gates_x, packed R, h0, c0, peephole), then six per
    further layer (Wᵀ in panels, bias, packed R, h0, c0, peephole). Raises ValueError for any other count."""
    if len(inputs) < 11 or (len(inputs) - 5) % 6:
        raise ValueError(f"lstm_stack: {len(inputs)} inputs are not 5 for the first layer and 6 per further layer")
    return [inputs[:5], *(inputs[at:at + 6] for at in range(5, len(inputs), 6))]


def lstm_stack(inputs: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Forward LSTM layers one above the other, each layer's input the sequence of h of the layer below.

    inputs: the first layer as lstm_recurrence takes it (gates_x, packed R, h0, c0, peephole), then per further
    layer its input weights Wᵀ [I, 4H] packed in panels of PANEL columns [4H/PANEL, I, PANEL], its bias
    Wb + Rb [4H], packed R, h0, c0, peephole. Returns the top layer's Y, Y_h and Y_c."""
    first, *above = stack_layers(inputs)
    ys, last_h, last_c = lstm_recurrence(first[0], first[1], first[2], first[3], first[4], "forward")
    for panels, bias, recurrence, h0, c0, peephole in above:
        seq, _, batch, features = ys.shape
        weights = panels.transpose(1, 0, 2).reshape(features, -1)  # back to Wᵀ [I, 4H]
        gates = (ys.reshape(seq * batch, features) @ weights + bias).reshape(1, seq, batch, -1)
        ys, last_h, last_c = lstm_recurrence(gates.astype(ys.dtype), recurrence, h0, c0, peephole, "forward")
    return ys, last_h, last_c


# -------------------------------------------------------------------------------------- index-driven

def top_k(x: np.ndarray, axis: int, k: int, largest: bool) -> tuple[np.ndarray, np.ndarray]:
    """ONNX TopK, always sorted: ties keep the lower index first; NaN sorts as the largest value."""
    moved = np.moveaxis(x, axis, -1)
    n = moved.shape[-1]
    if largest:
        # a stable ascending sort of the reversed axis, read backwards: descending values, ties in index order
        order = n - 1 - np.argsort(moved[..., ::-1], axis=-1, kind="stable")[..., ::-1]
    else:
        order = np.argsort(moved, axis=-1, kind="stable")
    indices = order[..., :k].astype(np.int64)
    values = np.take_along_axis(moved, indices, axis=-1)
    return np.asarray(np.moveaxis(values, -1, axis), order="C"), np.asarray(np.moveaxis(indices, -1, axis), order="C")


def cumsum(x: np.ndarray, axis: int, exclusive: bool, reverse: bool) -> np.ndarray:
    data = np.flip(x, axis) if reverse else x
    total = np.cumsum(data, axis=axis, dtype=x.dtype)
    if exclusive:
        total = np.concatenate([np.zeros_like(np.take(total, [0], axis=axis)),
                                np.take(total, np.arange(x.shape[axis] - 1), axis=axis)], axis=axis)  # fmt: skip
    return np.asarray(np.flip(total, axis) if reverse else total, order="C")


_SCATTER_COMBINE = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def scatter_nd(data: np.ndarray, indices: np.ndarray, updates: np.ndarray, reduction: str) -> np.ndarray:
    """ONNX ScatterND; indices are checked (negative ones count from the end)."""
    out = data.copy()
    k = indices.shape[-1]
    flat_indices = indices.reshape(-1, k)
    flat_updates = updates.reshape((flat_indices.shape[0], *data.shape[k:]))
    dims = np.array(data.shape[:k])
    for index, update in zip(flat_indices, flat_updates, strict=True):
        if np.any(index < -dims) or np.any(index >= dims):
            raise IndexError(f"scatter_nd index {tuple(index)} out of range for {tuple(dims)}")
        position = tuple(np.where(index < 0, index + dims, index))
        out[position] = update if reduction == "none" else _SCATTER_COMBINE[reduction](out[position], update)
    return out
