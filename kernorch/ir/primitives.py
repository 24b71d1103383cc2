"""The primitive set: every operator is fissioned into these (Korch §3).

Korch's four kinds, plus opaque:

- ELEMENTWISE: out[x] = f(in1[x], in2[x], ...). Inputs broadcast numpy-style to the output shape
  (Korch's footnote: broadcast is implicit in elementwise computation), all inputs share one dtype.
- REDUCE / BROADCAST: reduce_* aggregate along `axes` and always keep the reduced axes as size 1, so
  the consumer broadcasts implicitly; window_* reduce over sliding windows (pooling); `expand` is the
  explicit broadcast.
- LAYOUT: move data without arithmetic (reshape, transpose, slice, concat, split, pad, gather,
  gather_elements, resize). Resize in linear/cubic mode interpolates, but like a layout primitive it
  reads a bounded neighbourhood of input positions per output position.
- LINEAR: compute-intensive and linear in each input: matmul, conv, conv_transpose.
- OPAQUE: no decomposition; runs as its own kernel (lstm_recurrence: a sequential scan; onnx_node: an ONNX
  node without a rule, run by onnxruntime).

Each primitive declares `infer(input_types, attrs) -> output_types` and
`reference(inputs, attrs) -> outputs`. The reference is the executable spec every later stage
is tested against.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kernorch.ir import contracts as C
from kernorch.ir import foreign, numeric
from kernorch.ir import reference_kernels as K
from kernorch.ir.types import TensorType

Attrs = dict[str, Any]
Infer = Callable[[Sequence[TensorType], Attrs], list[TensorType]]
Reference = Callable[[Sequence[np.ndarray], Attrs], list[np.ndarray]]


class Kind(enum.Enum):
    ELEMENTWISE = "elementwise"
    REDUCE = "reduce/broadcast"
    LAYOUT = "layout"
    LINEAR = "linear"
    OPAQUE = "opaque"


@dataclass(frozen=True)
class Primitive:
    name: str
    kind: Kind
    infer: Infer
    reference: Reference
    doc: str


PRIMITIVES: dict[str, Primitive] = {}


def _register(name: str, kind: Kind, infer: Infer, reference: Reference, doc: str) -> None:
    if name in PRIMITIVES:
        raise ValueError(f"primitive {name} registered twice")
    PRIMITIVES[name] = Primitive(name, kind, infer, reference, doc)


def _same_dtype(types: Sequence[TensorType]) -> str:
    dtypes = {t.dtype for t in types}
    if len(dtypes) != 1:
        raise ValueError(f"elementwise inputs must share a dtype, got {sorted(dtypes)}")
    return dtypes.pop()


def _broadcast(types: Sequence[TensorType]) -> tuple[int, ...]:
    return tuple(int(d) for d in np.broadcast_shapes(*(t.shape for t in types)))


def _torch_unary(name: str) -> Callable[[np.ndarray], np.ndarray]:
    """torch's implementation of `name` (imported on first use: generated plans run without torch)."""

    def apply(x: np.ndarray) -> np.ndarray:
        return getattr(K.torch_module(), name)(K.to_torch(x)).numpy()  # type: ignore[no-any-return]

    return apply


# ------------------------------------------------------------------------------------------ elementwise

def _int_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return numeric.int_div(a, b) if a.dtype.kind in "iu" else np.divide(a, b)


def _fmod(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return numeric.int_fmod(a, b) if a.dtype.kind in "iu" else np.fmod(a, b)


def _pow(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return numeric.int_pow(a, b) if a.dtype.kind in "iub" else np.power(a, b)


_UNARY: dict[str, tuple[Callable[[np.ndarray], np.ndarray], str]] = {
    "identity": (lambda x: x.copy(), "x"),
    "neg": (np.negative, "-x"),
    "abs": (np.abs, "|x|"),
    "exp": (np.exp, "e^x"),
    "log": (np.log, "ln x"),
    "log1p": (np.log1p, "ln(1 + x), accurate for small x"),
    "sqrt": (np.sqrt, "√x"),
    "reciprocal": (np.reciprocal, "1/x"),
    "sin": (np.sin, "sin x"),
    "cos": (np.cos, "cos x"),
    "tanh": (np.tanh, "tanh x"),
    "sigmoid": (_torch_unary("sigmoid"), "1/(1+e^-x)"),
    "erf": (_torch_unary("erf"), "error function"),
    "relu": (lambda x: np.maximum(x, np.zeros((), x.dtype)), "max(x, 0)"),
    "floor": (np.floor, "⌊x⌋"),
    "ceil": (np.ceil, "⌈x⌉"),
    "round": (np.round, "round half to even"),
    "sign": (np.sign, "sign x"),
    "not": (np.logical_not, "logical not"),
}

_BINARY: dict[str, tuple[Callable[[np.ndarray, np.ndarray], np.ndarray], bool, str]] = {
    # name: (function, result is bool, doc)
    "add": (np.add, False, "a + b"),
    "sub": (np.subtract, False, "a - b"),
    "mul": (np.multiply, False, "a * b"),
    "div": (_int_div, False, "a / b (integers truncate toward zero)"),
    "fmod": (_fmod, False, "remainder of a / b truncated toward zero, the sign of a (C fmod); an integer b = 0 "
             "is an error"),
    "pow": (_pow, False, "a ^ b (integers: computed in float64, converted as Cast)"),
    "max": (np.maximum, False, "max(a, b), NaN-propagating"),
    "min": (np.minimum, False, "min(a, b), NaN-propagating"),
    "equal": (np.equal, True, "a == b"),
    "less": (np.less, True, "a < b"),
    "greater": (np.greater, True, "a > b"),
    "less_equal": (np.less_equal, True, "a <= b"),
    "greater_equal": (np.greater_equal, True, "a >= b"),
    "and": (np.logical_and, True, "a ∧ b"),
    "or": (np.logical_or, True, "a ∨ b"),
    "xor": (np.logical_xor, True, "a ⊕ b"),
}


def _unary_infer(types: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    (x,) = types
    return [x]


def _make_unary(fn: Callable[[np.ndarray], np.ndarray]) -> Reference:
    return lambda inputs, attrs: [np.asarray(fn(inputs[0])).astype(inputs[0].dtype, copy=False)]


for _name, (_fn, _doc) in _UNARY.items():
    _register(_name, Kind.ELEMENTWISE, _unary_infer, _make_unary(_fn), _doc)


def _make_binary_infer(boolean: bool) -> Infer:
    def infer(types: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
        dtype = _same_dtype(types)
        return [TensorType(_broadcast(types), "bool" if boolean else dtype)]

    return infer


def _make_binary(fn: Callable[[np.ndarray, np.ndarray], np.ndarray], boolean: bool) -> Reference:
    def reference(inputs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
        a, b = inputs
        result = np.asarray(fn(a, b))
        return [result.astype(bool if boolean else a.dtype, copy=False)]

    return reference


for _name, (_bfn, _boolean, _doc) in _BINARY.items():
    _register(_name, Kind.ELEMENTWISE, _make_binary_infer(_boolean), _make_binary(_bfn, _boolean), _doc)

# The primitives whose result is boolean whatever their operands (the comparisons and the connectives; `not` takes
# and gives bool): one fact for every renderer, which stores such a result as a byte (C) or a bool (Triton)
BOOLEAN_RESULTS = frozenset([name for name, (_, boolean, _) in _BINARY.items() if boolean] + ["not"])


def _where_infer(types: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    condition, a, b = types
    if condition.dtype != "bool":
        raise ValueError("where condition must be bool")
    return [TensorType(_broadcast(types), _same_dtype([a, b]))]


_register("where", Kind.ELEMENTWISE, _where_infer,
          lambda inputs, attrs: [np.where(inputs[0], inputs[1], inputs[2])], "cond ? a : b")  # fmt: skip


def _saturating_round_infer(types: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    if _same_dtype(types) != "float32":
        raise ValueError(f"saturating_round takes float32, got {types[0].dtype}")
    return [TensorType(_broadcast(types), "float32")]


def _saturating_round(inputs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    x, offset, low, high = inputs
    shifted = np.round(x) + offset
    above = np.where(shifted > low, shifted, low)  # NaN compares false: low
    return [np.asarray(np.where(above < high, above, high), np.float32)]


# QuantizeLinear's (and a requantization's) integer step as one primitive: a quantizer is then three primitives
# (x / scale, this, the cast) rather than eight, so its chains fit kernels and subgraphs, and planning a quantized
# model enumerates candidates over a graph not 6x its float model's
_register("saturating_round", Kind.ELEMENTWISE, _saturating_round_infer, _saturating_round,
          "round half to even(x) + offset, saturated to [low, high] (NaN: low)")  # fmt: skip
# Functions constant between jumps: a rounding difference in their operand becomes a whole step in their result
# (a quotient x / c rewritten x · (1/c) lands one quantization step off), and no smooth post-op computes them
STEP_FUNCTIONS = frozenset({"round", "floor", "ceil", "sign", "saturating_round"})

def _cast_infer(types: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    if "bfloat16" in (attrs["to"], types[0].dtype) and {attrs["to"], types[0].dtype} != {"float32", "bfloat16"}:
        raise ValueError(f"bfloat16 converts from and to float32 only, not {types[0].dtype} to {attrs['to']}")
    return [TensorType(types[0].shape, attrs["to"])]


_register(
    "cast", Kind.ELEMENTWISE, _cast_infer,
    lambda inputs, attrs: [numeric.cast(inputs[0], attrs["to"])],
    "convert to dtype `to` (ONNX's Cast, onnxruntime's out-of-range results: ir/numeric.py)",
)  # fmt: skip


# ----------------------------------------------------------------------------------- reduce/broadcast

def _reduce_infer(types: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    (x,) = types
    axes = C.integers(attrs["axes"], "axes")
    if sorted(set(axes)) != list(axes) or any(a < 0 or a >= x.rank for a in axes):
        raise ValueError(f"reduce axes must be sorted, unique, in range: {axes}")
    return [TensorType(tuple(1 if i in axes else d for i, d in enumerate(x.shape)), x.dtype)]


@dataclass(frozen=True)
class Reduction:
    """What every renderer of a reduction must agree on, beside its combining step. `identity`: the accumulator's
    initial value, which is also the result over no values (ONNX 18) — "zero", "one", "lowest" (-inf, or the
    dtype's minimum) or "highest". `propagates_nan`: a NaN among the values is the result (max and min as
    np.maximum / np.minimum, where C's fmax and Triton's default max would drop it)."""

    reference: Callable[..., Any]
    identity: str
    propagates_nan: bool
    doc: str


REDUCTIONS: dict[str, Reduction] = {
    "reduce_sum": Reduction(np.sum, "zero", True, "Σ over axes"),
    "reduce_max": Reduction(np.max, "lowest", True, "max over axes"),
    "reduce_min": Reduction(np.min, "highest", True, "min over axes"),
    "reduce_prod": Reduction(np.prod, "one", True, "Π over axes"),
}


def reduction_identity(prim: str, dtype: str) -> int | float | bool:
    """The identity of reduction `prim` over `dtype` values, as a Python number (each renderer spells it)."""
    kind = REDUCTIONS[prim].identity
    if kind in ("zero", "one"):
        return int(kind == "one")
    low = kind == "lowest"
    if dtype == "bool":
        return not low
    if dtype in ("float16", "bfloat16", "float32", "float64"):
        return -math.inf if low else math.inf
    limits = np.iinfo(np.dtype(dtype))
    return int(limits.min if low else limits.max)


def _make_reduce(prim: str) -> Reference:
    fn = REDUCTIONS[prim].reference

    def reference(inputs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
        x = inputs[0]
        if x.size == 0 and prim in ("reduce_max", "reduce_min"):  # over nothing: the identity, as ONNX 18 says
            identity = reduction_identity(prim, "bool" if x.dtype == np.bool_ else str(x.dtype))
            return [np.asarray(fn(x, axis=tuple(attrs["axes"]), keepdims=True, initial=identity)).astype(x.dtype)]
        return [np.asarray(fn(x, axis=tuple(attrs["axes"]), keepdims=True)).astype(x.dtype, copy=False)]

    return reference


for _name, _reduction in REDUCTIONS.items():
    _register(_name, Kind.REDUCE, _reduce_infer, _make_reduce(_name), _reduction.doc + " (reduced axes kept as 1)")


def _window_infer(types: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    (x,) = types
    kernel = C.integers(attrs["kernel"], "kernel", low=1)
    spatial = len(kernel)
    if not 1 <= spatial <= x.rank:
        raise ValueError(f"a window over {spatial} axes of a rank-{x.rank} tensor")
    C.integers(attrs["strides"], "strides", spatial, low=1)
    C.integers(attrs["dilations"], "dilations", spatial, low=1)
    pads = C.integers(attrs["pads"], "pads", 2 * spatial, low=0)
    C.one_of(attrs["ceil_mode"], "ceil_mode", (False, True))
    lead = x.rank - spatial
    for i in range(spatial):  # ONNX: a pad as wide as the window would make windows of padding alone
        span = attrs["dilations"][i] * (kernel[i] - 1) + 1
        if pads[i] >= span or pads[spatial + i] >= span:
            raise ValueError(f"pads {pads} must be smaller than the window ({span}) on axis {lead + i}")
    sizes = [
        K.window_output_size(x.shape[lead + i], kernel[i], attrs["strides"][i], attrs["pads"][i],
                             attrs["pads"][spatial + i], attrs["dilations"][i], attrs["ceil_mode"])
        for i in range(spatial)
    ]  # fmt: skip
    return [TensorType((*x.shape[:lead], *sizes), x.dtype)]


def _make_window(reducer: str) -> Reference:
    return lambda inputs, attrs: [
        K.window_reduce(inputs[0], reducer, attrs["kernel"], attrs["strides"], attrs["pads"],
                        attrs["dilations"], attrs["ceil_mode"])
    ]  # fmt: skip


_register("window_max", Kind.REDUCE, _window_infer, _make_window("max"),
          "max over sliding windows of the trailing axes (padding never wins)")  # fmt: skip
_register("window_sum", Kind.REDUCE, _window_infer, _make_window("sum"),
          "sum over sliding windows of the trailing axes (padding adds 0)")  # fmt: skip


def _expand_infer(types: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    shape = tuple(attrs["shape"])
    if np.broadcast_shapes(types[0].shape, shape) != shape:
        raise ValueError(f"cannot expand {types[0].shape} to {shape}")
    return [TensorType(shape, types[0].dtype)]


_register("expand", Kind.REDUCE, _expand_infer,
          lambda inputs, attrs: [np.asarray(np.broadcast_to(inputs[0], attrs["shape"]), order="C")],
          "replicate along size-1 axes to `shape`")  # fmt: skip


# -------------------------------------------------------------------------------------------- layout

def _reshape_infer(types: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    shape = tuple(attrs["shape"])
    if int(np.prod(shape, dtype=np.int64)) != types[0].numel:
        raise ValueError(f"reshape {types[0].shape} -> {shape} changes the element count")
    return [TensorType(shape, types[0].dtype)]


_register("reshape", Kind.LAYOUT, _reshape_infer,
          lambda inputs, attrs: [inputs[0].reshape(attrs["shape"]).copy()], "same data, new shape")  # fmt: skip


def _transpose_infer(types: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    perm = C.integers(attrs["perm"], "perm")
    if sorted(perm) != list(range(types[0].rank)):
        raise ValueError(f"bad permutation {perm}")
    return [TensorType(tuple(types[0].shape[p] for p in perm), types[0].dtype)]


_register("transpose", Kind.LAYOUT, _transpose_infer,
          lambda inputs, attrs: [np.asarray(inputs[0].transpose(attrs["perm"]), order="C")],
          "permute axes")  # fmt: skip


def slice_length(start: int, stop: int, step: int) -> int:
    return len(range(start, stop, step))


def _slice_infer(types: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    ranges = attrs["ranges"]  # per axis (start, stop, step), as returned by slice.indices(dim)
    if not isinstance(ranges, (tuple, list)) or len(ranges) != types[0].rank:
        raise ValueError("slice needs one range per axis")
    for axis, (dim, one) in enumerate(zip(types[0].shape, ranges, strict=True)):
        start, stop, step = C.integers(one, f"ranges[{axis}]", 3)
        visited = range(start, stop, step) if step else None  # every index it reads must exist
        if visited is None or (visited and not (0 <= visited[0] < dim and 0 <= visited[-1] < dim)):
            raise ValueError(f"slice range {tuple(one)} reads outside an axis of size {dim}")
    return [TensorType(tuple(slice_length(*r) for r in ranges), types[0].dtype)]


def _slice_reference(inputs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    index = tuple(slice(start, stop if stop >= 0 else None, step) for start, stop, step in attrs["ranges"])
    return [np.asarray(inputs[0][index], order="C")]


_register("slice", Kind.LAYOUT, _slice_infer, _slice_reference,
          "strided sub-block: per axis (start, stop, step) in normalized form")  # fmt: skip


def _concat_infer(types: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    first = types[0]
    axis = C.axis(attrs["axis"], first.rank)
    for t in types[1:]:
        if t.rank != first.rank or any(a != b for i, (a, b) in enumerate(zip(t.shape, first.shape, strict=True))
                                       if i != axis):  # fmt: skip
            raise ValueError("concat inputs differ off the concat axis")
    shape = list(first.shape)
    shape[axis] = sum(t.shape[axis] for t in types)
    return [TensorType(tuple(shape), _same_dtype(types))]


# Layout primitives whose (one) output re-indexes the elements of their first input affinely for some shapes:
# a chain of them can be read through strides instead of copied (ir/strided.py decides when).
STRIDED_VIEW_PRIMS = frozenset({"transpose", "reshape", "slice", "split"})


_register("concat", Kind.LAYOUT, _concat_infer,
          lambda inputs, attrs: [np.concatenate(inputs, axis=attrs["axis"])], "join along `axis`")  # fmt: skip


def _split_infer(types: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    (x,) = types
    axis, sizes = C.axis(attrs["axis"], x.rank), C.integers(attrs["sizes"], "sizes", low=0)
    if sum(sizes) != x.shape[axis]:
        raise ValueError(f"split sizes {sizes} do not sum to {x.shape[axis]}")
    return [TensorType(x.shape[:axis] + (s,) + x.shape[axis + 1 :], x.dtype) for s in sizes]


def _split_reference(inputs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    cuts = np.cumsum(attrs["sizes"])[:-1]
    return [np.asarray(p, order="C") for p in np.split(inputs[0], cuts, axis=attrs["axis"])]


_register("split", Kind.LAYOUT, _split_infer, _split_reference, "cut along `axis` into `sizes`")


def _pad_infer(types: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    (x,) = types
    pads = C.integers(attrs["pads"], "pads")
    if len(pads) != 2 * x.rank or min(pads, default=0) < 0:
        raise ValueError(f"pad needs 2*rank non-negative pads, got {pads}")
    C.one_of(attrs["mode"], "mode", ("constant", "reflect", "edge", "wrap"))
    if attrs["mode"] != "constant" and any((pads[i] or pads[x.rank + i]) and d == 0 for i, d in enumerate(x.shape)):
        raise ValueError(f"{attrs['mode']} padding of an empty axis")
    if attrs["mode"] == "wrap" and any(max(pads[i], pads[x.rank + i]) > d for i, d in enumerate(x.shape)):
        raise ValueError("wrap pad must not be wider than the padded axis")
    if attrs["mode"] == "reflect" and any(
        (pads[i] or pads[x.rank + i]) and max(pads[i], pads[x.rank + i]) >= x.shape[i] for i in range(x.rank)
    ):
        raise ValueError("reflect pad must be smaller than the padded axis")
    return [TensorType(tuple(d + pads[i] + pads[x.rank + i] for i, d in enumerate(x.shape)), x.dtype)]


def _pad_reference(inputs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    x = inputs[0]
    pads, mode = attrs["pads"], attrs["mode"]
    width = [(pads[i], pads[x.ndim + i]) for i in range(x.ndim)]
    if mode == "constant":
        return [np.pad(x, width, mode="constant", constant_values=np.array(attrs["value"]).astype(x.dtype))]
    return [np.pad(x, width, mode=mode)]


_register("pad", Kind.LAYOUT, _pad_infer, _pad_reference,
          "grow each axis by (begin, end); mode constant (with `value`), reflect, edge or wrap")  # fmt: skip


def _gather_infer(types: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    data, indices = types
    axis = C.axis(attrs["axis"], data.rank)
    if indices.dtype not in ("int32", "int64"):
        raise ValueError("gather indices must be int32/int64")
    if data.shape[axis] == 0 and indices.numel:
        raise ValueError("gather from an empty axis")
    return [TensorType(data.shape[:axis] + indices.shape + data.shape[axis + 1 :], data.dtype)]


def _checked_indices(indices: np.ndarray, size: int) -> np.ndarray:
    if indices.size and (indices.min() < -size or indices.max() >= size):
        raise IndexError(f"gather index out of range [-{size}, {size})")
    return np.where(indices < 0, indices + size, indices)


_register("gather", Kind.LAYOUT, _gather_infer,
          lambda inputs, attrs: [np.take(inputs[0], _checked_indices(inputs[1], inputs[0].shape[attrs["axis"]]),
                                         axis=attrs["axis"])],
          "index `data` along `axis` with an integer tensor (e.g. embedding look-up)")  # fmt: skip


def _gather_elements_infer(types: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    data, indices = types
    if data.rank != indices.rank:
        raise ValueError("gather_elements needs equal ranks")
    axis = C.axis(attrs["axis"], data.rank)
    if indices.dtype not in ("int32", "int64"):
        raise ValueError("gather_elements indices must be int32/int64")
    # off the axis, an index is its own position: it must exist in data (ONNX; onnxruntime checks it too)
    beyond = [d for d in range(data.rank) if d != axis and indices.shape[d] > data.shape[d]]
    if beyond or (data.shape[axis] == 0 and indices.numel):
        raise ValueError(f"gather_elements indices {indices.shape} exceed data {data.shape} on axis "
                         f"{beyond[0] if beyond else axis}")  # fmt: skip
    return [TensorType(indices.shape, data.dtype)]


_register("gather_elements", Kind.LAYOUT, _gather_elements_infer,
          lambda inputs, attrs: [np.take_along_axis(
              inputs[0], _checked_indices(inputs[1], inputs[0].shape[attrs["axis"]]), axis=attrs["axis"])],
          "out[i] = data[i with i[axis] replaced by indices[i]]")  # fmt: skip


def _resize_infer(types: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    (x,) = types
    sizes = C.integers(attrs["sizes"], "sizes", x.rank, low=0)
    if len(attrs["scales"]) != x.rank or not all(isinstance(s, (int, float)) and s > 0 for s in attrs["scales"]):
        raise ValueError("resize needs one positive scale per axis")
    C.one_of(attrs["mode"], "mode", ("nearest", "linear", "cubic"))
    C.one_of(attrs["coordinate_mode"], "coordinate_mode", ("half_pixel", "pytorch_half_pixel", "align_corners",
                                                           "asymmetric", "half_pixel_symmetric"))
    C.one_of(attrs["nearest_mode"], "nearest_mode", ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil"))
    C.one_of(attrs["exclude_outside"], "exclude_outside", (False, True))
    if not isinstance(attrs["cubic_coeff_a"], (int, float)):
        raise ValueError(f"cubic_coeff_a must be a number, got {attrs['cubic_coeff_a']!r}")
    if any(out and not size for out, size in zip(sizes, x.shape, strict=True)):
        raise ValueError(f"resize of an empty axis to {sizes}")
    return [TensorType(sizes, x.dtype)]


_register("resize", Kind.LAYOUT, _resize_infer,
          lambda inputs, attrs: [K.resize(inputs[0], attrs["sizes"], attrs["scales"], attrs["mode"],
                                          attrs["coordinate_mode"], attrs["nearest_mode"],
                                          attrs["cubic_coeff_a"], attrs["exclude_outside"])],
          "nearest/linear/cubic interpolation to `sizes` (separable, axis by axis)")  # fmt: skip


# -------------------------------------------------------------------------------------------- linear

PRECISIONS = ("f32", "bf16")  # what a linear primitive multiplies; its sums and output are the value's dtype


def _precision(types: Sequence[TensorType], attrs: Attrs) -> str:
    """A linear primitive's `precision` (the precision stage's choice, kernorch/precision/) and its output dtype:
    bf16 multiplies float32 operands rounded to bfloat16, or bfloat16 ones (stored so by the kernel producing
    them), accumulating in float32; its output is float32."""
    precision = C.one_of(attrs.get("precision", "f32"), "precision", PRECISIONS)
    if precision == "bf16":
        if any(t.dtype not in ("float32", "bfloat16") for t in types):
            raise ValueError(f"precision bf16 needs float32 or bfloat16 operands, got "
                             f"{', '.join(t.dtype for t in types)}")  # fmt: skip
        return "float32"
    if any(t.dtype == "bfloat16" for t in types):
        raise ValueError("a bfloat16 operand needs precision bf16")
    return _same_dtype(types)


def _in_precision(inputs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    """The operands as a linear primitive of this precision multiplies them (float32 values, bfloat16's)."""
    if attrs.get("precision", "f32") != "bf16":
        return list(inputs)
    return [K.round_to_bf16(x.astype(np.float32) if x.dtype != np.float32 else x) for x in inputs]


def _matmul_infer(types: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    a, b = types
    dtype = _precision(types, attrs)
    return [TensorType(K.broadcast_matmul_shape(a.shape, b.shape), dtype)]


_register("matmul", Kind.LINEAR, _matmul_infer, lambda inputs, attrs: [K.matmul(*_in_precision(inputs, attrs))],
          "batched matrix product with numpy broadcasting; precision bf16: operands rounded to bfloat16, float32 "
          "sums")  # fmt: skip


INTEGER_OPERANDS = ("int8", "uint8")
# the longest sum of products of 8-bit differences (each at most 255² in magnitude) that cannot leave int32:
# its kernels accumulate in int32 with no overflow to define
MAX_INTEGER_K = (2**31 - 1) // 255**2


def _matmul_integer_infer(types: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    a, b, a_zero, b_zero = types
    for operand, zero, name in ((a, a_zero, "a"), (b, b_zero, "b")):
        if operand.dtype not in INTEGER_OPERANDS or zero.dtype != operand.dtype:
            raise ValueError(f"matmul_integer: {name} is {operand.dtype} with a {zero.dtype} zero point (int8 or "
                             "uint8, the zero point of its operand's type)")  # fmt: skip
    if a.rank < 2 or b.rank < 2:
        raise ValueError(f"matmul_integer: operands {a.shape} and {b.shape} (at least 2-D)")
    shape = K.broadcast_matmul_shape(a.shape, b.shape)
    if a.shape[-1] > MAX_INTEGER_K:
        raise ValueError(f"matmul_integer: K = {a.shape[-1]} could overflow int32 (at most {MAX_INTEGER_K})")
    # per tensor, or per row of a ([M, 1]) and per column of b ([N])
    if a_zero.shape not in ((), (a.shape[-2], 1)):
        raise ValueError(f"matmul_integer: a's zero point {a_zero.shape} is neither a scalar nor [M, 1]")
    if b_zero.shape not in ((), (b.shape[-1],)):
        raise ValueError(f"matmul_integer: b's zero point {b_zero.shape} is neither a scalar nor [N]")
    return [TensorType(shape, "int32")]


_register("matmul_integer", Kind.LINEAR, _matmul_integer_infer, lambda inputs, attrs: [K.matmul_integer(*inputs)],
          "(a - a_zero) @ (b - b_zero) of int8/uint8 operands with int32 sums (ONNX MatMulInteger); zero points per "
          "tensor, per row of a [M, 1] or per column of b [N]")  # fmt: skip


def _channels_first(shape: tuple[int, ...]) -> tuple[int, ...]:
    return (shape[0], shape[-1], *shape[1:-1])


def _channels_last(shape: tuple[int, ...]) -> tuple[int, ...]:
    return (shape[0], *shape[2:], shape[1])


def _conv_like(infer_shape: Callable[..., tuple[int, ...]], compute: Callable[..., np.ndarray],
               extra: tuple[str, ...]) -> tuple[Infer, Reference]:  # fmt: skip
    """infer/reference of a conv-like primitive; with `channels_last` its activations are [N, *spatial, C]
    (the layout stage's choice), the weights keep their ONNX layout."""

    def infer(types: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
        x, w = types
        spatial = x.rank - 2
        if spatial < 1 or w.rank != x.rank:
            raise ValueError(f"a convolution of {x.shape} by weights {w.shape}")
        C.integer(attrs["group"], "group", low=1)
        C.integers(attrs["strides"], "strides", spatial, low=1)
        C.integers(attrs["dilations"], "dilations", spatial, low=1)
        C.integers(attrs["pads"], "pads", 2 * spatial, low=0)
        for name in extra:
            C.integers(attrs[name], name, spatial, low=0)
        C.one_of(attrs.get("channels_last", False), "channels_last", (False, True))
        dtype = _precision(types, attrs)
        last = bool(attrs.get("channels_last", False))
        x_shape = _channels_first(x.shape) if last else x.shape
        shape = infer_shape(x_shape, w.shape, attrs["strides"], attrs["pads"], attrs["dilations"], attrs["group"],
                            *(attrs[name] for name in extra))  # fmt: skip
        return [TensorType(_channels_last(shape) if last else shape, dtype)]

    def reference(inputs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
        x, w = _in_precision(inputs, attrs)
        last = bool(attrs.get("channels_last", False))
        x_first = np.moveaxis(x, -1, 1) if last else x
        y = compute(x_first, w, attrs["strides"], attrs["pads"], attrs["dilations"], attrs["group"],
                    *(attrs[name] for name in extra))  # fmt: skip
        return [np.asarray(np.moveaxis(y, 1, -1), order="C") if last else y]

    return infer, reference


_conv_infer, _conv_reference = _conv_like(K.conv_output_shape, K.conv, ())
_register("conv", Kind.LINEAR, _conv_infer, _conv_reference,
          "N-d cross-correlation (grouped, dilated, strided, padded), no bias; "
          "channels_last: activations [N, *spatial, C]")  # fmt: skip


def _conv_integer_infer(types: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    x, w, x_zero, w_zero = types
    for operand, zero, name in ((x, x_zero, "x"), (w, w_zero, "w")):
        if operand.dtype not in INTEGER_OPERANDS or zero.dtype != operand.dtype or zero.shape != ():
            raise ValueError(f"conv_integer: {name} is {operand.dtype} with a {zero.dtype} zero point of shape "
                             f"{zero.shape} (int8 or uint8, a scalar zero point of its operand's type)")  # fmt: skip
    if w.rank >= 2 and w.numel // max(w.shape[0], 1) > MAX_INTEGER_K:
        raise ValueError(f"conv_integer: {w.numel // w.shape[0]} products per output could overflow int32 (at most "
                         f"{MAX_INTEGER_K})")  # fmt: skip
    (sums,) = _conv_infer([TensorType(x.shape, "float32"), TensorType(w.shape, "float32")], attrs)
    return [TensorType(sums.shape, "int32")]


def _conv_integer_reference(inputs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    """Sums of the centred operands in float64, where every partial sum of 8-bit products is an integer far below
    2^53: exact, as int32 accumulation is. Padding contributes 0 (ONNX: the input padded with its zero point)."""
    x, w, x_zero, w_zero = inputs
    centred_x = x.astype(np.float64) - float(x_zero)
    centred_w = w.astype(np.float64) - float(w_zero)
    (sums,) = _conv_reference([centred_x, centred_w], attrs)
    return [np.rint(sums).astype(np.int32)]


_register("conv_integer", Kind.LINEAR, _conv_integer_infer, _conv_integer_reference,
          "convolution (x - x_zero) * (w - w_zero) of int8/uint8 operands with int32 sums (ONNX ConvInteger, padding "
          "counting nothing); zero points per tensor; channels_last: activations [N, *spatial, C]")  # fmt: skip
_register("conv_transpose", Kind.LINEAR,
          *_conv_like(K.conv_transpose_output_shape, K.conv_transpose, ("output_padding",)),
          "transposed convolution, no bias; channels_last: activations [N, *spatial, C]")  # fmt: skip


def pointwise_conv(prim: str, attrs: Attrs, weight: np.ndarray | None) -> bool:
    """A conv that only mixes channels — a constant 1x1 kernel, one group, no padding or stride, NCHW: per
    pixel, a product with its [O, C] weight (a matmul over the channel axis)."""
    return prim == "conv" and weight is not None and weight.ndim >= 3 and all(k == 1 for k in weight.shape[2:]) \
        and attrs["group"] == 1 and not any(attrs["pads"]) and all(s == 1 for s in attrs["strides"]) \
        and not attrs.get("channels_last", False)  # fmt: skip


# -------------------------------------------------------------------------------------------- opaque

def _lstm_infer(types: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    gates_x, packed = types[0], types[1]
    if gates_x.rank != 4 or gates_x.shape[3] % 4:
        raise ValueError(f"lstm_recurrence: input gates {gates_x.shape} are not [D, T, N, 4H]")
    dirs, seq, batch, four_h = gates_x.shape
    hidden = four_h // 4
    block = C.integer(attrs["unit_block"], "unit_block", low=1)
    C.one_of(attrs.get("direction", "forward"), "direction", ("forward", "reverse", "bidirectional"))
    if hidden % block or packed.shape != (dirs, hidden // block, hidden, 4, block):
        raise ValueError(f"lstm_recurrence: recurrent weights {packed.shape} are not packed in blocks of "
                         f"{block} units for hidden size {hidden}")  # fmt: skip
    state = TensorType((dirs, batch, hidden), gates_x.dtype)
    # the initial states and the peepholes, when given, are read whole by the scan
    for name, given, shape in (("h0", types[2:3], state.shape), ("c0", types[3:4], state.shape),
                               ("peephole", types[4:5], (dirs, 3 * hidden))):  # fmt: skip
        if given and given[0].shape != shape:
            raise ValueError(f"lstm_recurrence: {name} {given[0].shape} is not {shape}")
    return [TensorType((seq, dirs, batch, hidden), gates_x.dtype), state, state]


_register("lstm_recurrence", Kind.OPAQUE, _lstm_infer,
          lambda inputs, attrs: list(K.lstm_recurrence(inputs[0], inputs[1], inputs[2], inputs[3], inputs[4],
                                                       direction=attrs["direction"])),
          "sequential LSTM scan over precomputed input gates (inputs: gates_x, R packed in blocks of `unit_block` "
          "units [D, H/unit_block, H, 4, unit_block], h0, c0, peephole)")


def _lstm_stack_infer(types: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    """Layer 0's five lstm_recurrence inputs, then six per further layer (see reference_kernels.lstm_stack);
    each layer is checked as lstm_recurrence checks it, against the hidden size of the layer below."""
    blocks = attrs["unit_blocks"]
    first, *above = K.stack_layers(types)
    if len(blocks) != 1 + len(above):
        raise ValueError(f"lstm_stack: {len(types)} inputs for {len(blocks)} layers")
    outputs = _lstm_infer(first, {"unit_block": blocks[0]})
    if types[0].shape[0] != 1:
        raise ValueError("lstm_stack: stacked layers run forward, one direction")
    for layer, (panels, bias, packed, *_) in enumerate(above, start=1):
        seq, _, batch, features = outputs[0].shape
        four_h = panels.shape[0] * panels.shape[2]
        if panels.shape != (four_h // K.PANEL, features, K.PANEL) or bias.shape != (four_h,):
            raise ValueError(f"lstm_stack: layer {layer} input weights {panels.shape} / bias {bias.shape} do not "
                             f"fit {features} input features in panels of {K.PANEL}")  # fmt: skip
        gates = TensorType((1, seq, batch, four_h), types[0].dtype)
        outputs = _lstm_infer([gates, packed], {"unit_block": blocks[layer]})
    return outputs


_register("lstm_stack", Kind.OPAQUE, _lstm_stack_infer, lambda inputs, attrs: list(K.lstm_stack(inputs)),
          "forward LSTM layers stacked, run as waves of (layer, steps) rTasks (inputs: layer 0's lstm_recurrence "
          "inputs, then per layer: Wᵀ in panels, bias, packed R, h0, c0, peephole; `unit_blocks` per layer)")


def _top_k_infer(types: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    (x,) = types
    axis, k = C.axis(attrs["axis"], x.rank), C.integer(attrs["k"], "k")
    C.one_of(attrs["largest"], "largest", (False, True))
    if not 0 <= k <= x.shape[axis]:
        raise ValueError(f"top_k k={k} out of range for axis of size {x.shape[axis]}")
    shape = x.shape[:axis] + (k,) + x.shape[axis + 1 :]
    return [TensorType(shape, x.dtype), TensorType(shape, "int64")]


_register("top_k", Kind.OPAQUE, _top_k_infer,
          lambda inputs, attrs: list(K.top_k(inputs[0], attrs["axis"], attrs["k"], attrs["largest"])),
          "the k largest (or smallest) values along `axis` in order, and their indices; ties keep the lower "
          "index first, NaN counts as the largest")  # fmt: skip

def _cumsum_infer(types: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    C.axis(attrs["axis"], types[0].rank)
    C.one_of(attrs["exclusive"], "exclusive", (False, True))
    C.one_of(attrs["reverse"], "reverse", (False, True))
    return [types[0]]


_register("cumsum", Kind.OPAQUE, _cumsum_infer,
          lambda inputs, attrs: [K.cumsum(inputs[0], attrs["axis"], attrs["exclusive"], attrs["reverse"])],
          "running sum along `axis` (exclusive: without the element itself; reverse: from the end)")  # fmt: skip


def _scatter_nd_infer(types: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    data, indices, updates = types
    k = indices.shape[-1] if indices.rank else 0
    if indices.dtype != "int64" or not 1 <= k <= data.rank:
        raise ValueError("scatter_nd indices must be int64 with last dimension in [1, rank]")
    C.one_of(attrs["reduction"], "reduction", ("none", "add", "mul", "max", "min"))
    if updates.shape != indices.shape[:-1] + data.shape[k:] or updates.dtype != data.dtype:
        raise ValueError(f"scatter_nd updates {updates} do not fit data {data} and indices {indices}")
    return [data]


_register("scatter_nd", Kind.OPAQUE, _scatter_nd_infer,
          lambda inputs, attrs: [K.scatter_nd(inputs[0], inputs[1], inputs[2], attrs["reduction"])],
          "a copy of data with slices at index tuples replaced (or combined: add, mul, max, min) by updates, "
          "in index order")  # fmt: skip


def _onnx_node_infer(types: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    expected = [TensorType(tuple(shape), dtype) for shape, dtype in attrs["inputs"]]
    if list(types) != expected:
        raise ValueError(f"onnx_node {attrs['op_type']} was typed for inputs {expected}, got {list(types)}")
    return list(foreign.output_types(attrs))


_register("onnx_node", Kind.OPAQUE, _onnx_node_infer, lambda inputs, attrs: foreign.run_onnx_node(inputs, attrs),
          "an ONNX node kernorch has no rule for, run whole by onnxruntime (attrs: node, opsets, inputs, "
          "outputs, op_type, reason)")


def run_primitive(name: str, inputs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    """Evaluate one primitive with its reference implementation (float errors silenced, like ONNX)."""
    with np.errstate(all="ignore"):
        return PRIMITIVES[name].reference(inputs, attrs)
