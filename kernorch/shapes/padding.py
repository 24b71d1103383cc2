"""When padding a symbolic dim is exact: a proof per primitive, else a refusal with the reason.

A call of size n along a symbolic dim may run on the plan of a larger bucket P (its rows n..P-1 copies of the
last real row, so the padding holds only values the call itself holds) and have its outputs cut back to n rows
— exactly when two things hold:

1. **The graph reads the dim only as a shape.** The model imported at P and at n fissions into the same
   primitives with the same constants (or constants whose rows at n are the first rows at P: a position table),
   their attributes differing only in shape attributes (SIZE_ATTRIBUTES), where one holds k·P and the other k·n.
   A size that reaches a value — a divisor or an added constant (folded into a constant), a slice's start or
   step, a pad amount or value, a clip bound — is refused, naming the primitive.
2. **Rows stay apart.** Walking the primitive graph at P, every value either does not depend on a padded input
   ("clean") or has one axis of size P along which row i depends on row i of the padded inputs alone. Each
   primitive has a rule (elementwise with broadcasting, reductions and windows over other axes, transposes,
   row-preserving reshapes, slices/concats/splits/pads along other axes, gathers, matmul over batch or row
   axes, convolutions over the batch); anything else — a reduction over the dim, softmax over a padded
   sequence, a recurrence, an opaque onnxruntime node — ends the proof with its reason.

Then row i < n of each output equals the unpadded model's row i, for every input.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kernorch.fission import fission
from kernorch.frontend import InputSignature, import_model, shapes_for
from kernorch.ir.graph import Graph, Node

CLEAN = None  # a value no padded input reaches
# The attributes where a size may stand as a shape (k·P at the bucket, k·n at the call): a target shape, a
# slice's stop, a split's sizes — the shape checks of _row_axes then follow it. In any other attribute (a slice's
# start or step, pad amounts, a pad value, a clip bound folded in) a size is a value the computation reads, and
# padding would change it: refused.
SIZE_ATTRIBUTES: dict[str, tuple[str, ...]] = {"reshape": ("shape",), "expand": ("shape",), "slice": ("ranges",),
                                               "split": ("sizes",)}  # fmt: skip


class NotProven(Exception):
    """The reason padding is not shown exact."""


@dataclass(frozen=True)
class PaddingProof:
    """The outcome for padding `dims` up to `target` sizes: exact or not (with the reason), and where each padded
    input's and each output's padded axis is."""

    dims: tuple[str, ...]
    target: dict[str, int]
    exact: bool
    reason: str = ""
    input_axes: dict[str, dict[str, int]] = field(default_factory=dict)  # dim -> input -> axis
    output_axes: dict[str, dict[str, int | None]] = field(default_factory=dict)  # dim -> output -> axis or CLEAN
    sizes: dict[str, int] = field(default_factory=dict)  # the call's size of each padded dim

    def run(self, plan: Any, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Pad the feeds (edge rows), run the bucket's plan, cut the outputs back."""
        padded = dict(feeds)
        for dim in self.dims:
            for name, axis in self.input_axes[dim].items():
                widths = [(0, 0)] * np.ndim(padded[name])
                widths[axis] = (0, self.target[dim] - self.sizes[dim])
                padded[name] = np.pad(np.asarray(padded[name]), widths, mode="edge")
        outputs = plan.run(padded)
        for dim in self.dims:
            for name, output_axis in self.output_axes[dim].items():
                if output_axis is not None:
                    index = [slice(None)] * outputs[name].ndim
                    index[output_axis] = slice(0, self.sizes[dim])
                    outputs[name] = np.asarray(outputs[name][tuple(index)], order="C")
        return outputs


def prove_paddable(model: bytes, signature: Sequence[InputSignature], dims: Sequence[str],
                   target: Mapping[str, int], call: Mapping[str, int]) -> PaddingProof:  # fmt: skip
    """Whether running the sizes `call` on the plan of `target` (larger along `dims`, equal elsewhere) is exact."""
    dims = tuple(dims)
    try:
        at_target = fission(import_model(model, dict(shapes_for(signature, target))))
        input_axes: dict[str, dict[str, int]] = {}
        output_axes: dict[str, dict[str, int | None]] = {}
        for dim in dims:  # one dim at a time, the others at the bucket's sizes: rows apart along each
            at_call = fission(import_model(model, dict(shapes_for(signature, {**target, dim: call[dim]}))))
            prefixes = _same_program(at_target, at_call, {dim: (target[dim], call[dim])})
            seeds = {s.name: s.dims.index(dim) for s in signature if dim in s.dims}
            for entry in signature:
                if entry.dims.count(dim) > 1:
                    raise NotProven(f"input '{entry.name}' has '{dim}' on two axes")
            axes = _row_axes(at_target, at_call, {**prefixes, **seeds}, target[dim], call[dim])
            input_axes[dim] = seeds
            output_axes[dim] = {name: axes[name] for name in at_target.outputs}
    except NotProven as reason:
        return PaddingProof(dims, dict(target), False, str(reason))
    return PaddingProof(dims, dict(target), True, "", input_axes, output_axes, {d: call[d] for d in dims})


def _same_program(padded: Graph, actual: Graph, sizes: Mapping[str, tuple[int, int]]) -> dict[str, int]:
    """Condition 1 of the module doc. Returns the constants that follow the size as prefixes (a position table
    sliced to the sequence length, folded into a constant): name -> the axis where the call's is a prefix."""
    if len(padded.nodes) != len(actual.nodes):
        raise NotProven(f"the graph has {len(padded.nodes)} primitives at one size and {len(actual.nodes)} at "
                        "another (its structure depends on the size)")  # fmt: skip
    for a, b in zip(padded.nodes, actual.nodes, strict=True):
        if a.prim != b.prim or a.inputs != b.inputs or a.outputs != b.outputs or len(a.attrs) != len(b.attrs):
            raise NotProven(f"{a.prim} ({a.origin}) differs between sizes")
        for (key, x), (other_key, y) in zip(a.attrs, b.attrs, strict=True):
            if key != other_key:
                raise NotProven(f"{a.prim} ({a.origin}) differs between sizes")
            if _same_modulo_size(x, y, ()):
                continue
            if key not in SIZE_ATTRIBUTES.get(a.prim, ()):
                raise NotProven(f"{a.prim} ({a.origin}) reads the size as a value (its attribute {key})")
            same = _same_stops(x, y, sizes.values()) if a.prim == "slice" else _same_modulo_size(x, y, sizes.values())
            if not same:
                raise NotProven(f"{a.prim} ({a.origin}) attribute {key} depends on the size other than as a shape")
    prefixes: dict[str, int] = {}
    for name, value in padded.constants.items():
        other = actual.constants.get(name)
        if other is not None and value.shape == other.shape and np.array_equal(value, other, equal_nan=True):
            continue
        axis = _prefix_axis(value, other)
        if axis is None:
            raise NotProven(f"constant '{name}' depends on the size (the model computes with it, e.g. divides by "
                            "it)")  # fmt: skip
        prefixes[name] = axis
    return prefixes


def _prefix_axis(value: np.ndarray, other: np.ndarray | None) -> int | None:
    """The one axis along which `other` is the leading rows of `value`, or None."""
    if other is None or value.ndim != other.ndim:
        return None
    differing = [axis for axis in range(value.ndim) if value.shape[axis] != other.shape[axis]]
    if len(differing) != 1 or value.shape[differing[0]] < other.shape[differing[0]]:
        return None
    axis = differing[0]
    leading = np.take(value, np.arange(other.shape[axis]), axis=axis)
    return axis if np.array_equal(leading, other, equal_nan=True) else None


def _same_stops(x: Any, y: Any, sizes: Any) -> bool:
    """A slice's ranges at two sizes: the same starts and steps, stops equal or following the size. A start or a
    step that follows the size picks other elements (a step of 3 or 4 over 6 columns keeps 2 either way)."""
    if not (isinstance(x, tuple) and isinstance(y, tuple) and len(x) == len(y)):
        return False
    return all(len(a) == len(b) == 3 and a[0] == b[0] and a[2] == b[2] and _same_modulo_size(a[1], b[1], sizes)
               for a, b in zip(x, y, strict=True))  # fmt: skip


def _same_modulo_size(x: Any, y: Any, sizes: Any) -> bool:
    if isinstance(x, tuple) and isinstance(y, tuple):
        return len(x) == len(y) and all(_same_modulo_size(a, b, sizes) for a, b in zip(x, y, strict=True))
    if isinstance(x, int) and isinstance(y, int) and not isinstance(x, bool) and x != y:
        return any(x % p == 0 and y * p == x * n for p, n in sizes)  # k·P there, k·n here
    return bool(x == y) and type(x) is type(y)


def _row_axes(graph: Graph, other: Graph, seeds: Mapping[str, int], size: int,
              other_size: int) -> dict[str, int | None]:  # fmt: skip
    """Condition 2: each value's padded axis (or CLEAN), or NotProven. A value's padded axis is where its size is
    P in `graph` and n in `other` (the program at the call's size); a clean value has one shape in both."""
    axes: dict[str, int | None] = {name: seeds.get(name, CLEAN) for name in [*graph.constants, *graph.inputs]}
    for node in graph.nodes:
        where = f"{node.prim} ({node.origin or 'unnamed'})"
        tracked = [axes[i] for i in node.inputs]
        shapes = [graph.types[i].shape for i in node.inputs]
        try:
            if any(a is not None for a in tracked):
                out = _rule(node, graph, shapes, tracked, size)
            else:
                out = [_sized_from_clean(node, shapes[0] if shapes else (), graph.types[o].shape,
                                         other.types[o].shape) for o in node.outputs]  # fmt: skip
            for name, axis in zip(node.outputs, out, strict=True):
                here, there = graph.types[name].shape, other.types[name].shape
                expected = list(here)
                if axis is not None:
                    expected[axis] = other_size
                if (axis is not None and here[axis] != size) or tuple(expected) != there:
                    raise NotProven(f"its output's shape {list(here)} / {list(there)} does not follow the padded "
                                    "axis")  # fmt: skip
        except NotProven as reason:
            raise NotProven(f"{where}: {reason}") from None
        axes.update(zip(node.outputs, out, strict=True))
    return axes


def _sized_from_clean(node: Node, shape: tuple[int, ...], here: tuple[int, ...], there: tuple[int, ...]) -> int | None:
    """A value made from clean inputs whose shape follows the padded size: only an expand of a size-1 axis (equal
    rows) or a prefix slice (row i is the source's row i at any size) keeps row i the same at every size."""
    differing = [axis for axis, (a, b) in enumerate(zip(here, there, strict=True)) if a != b] \
        if len(here) == len(there) else [-1]
    if not differing:
        return CLEAN
    if len(differing) == 1:
        (axis,) = differing
        if node.prim == "expand" and len(shape) == len(here) and shape[axis] == 1:
            return axis
        if node.prim == "slice" and tuple(node.attr("ranges")[axis])[::2] == (0, 1):
            return axis
    raise NotProven("its shape follows the padded size, but not as equal or prefix rows")


def _broadcast_axis(shapes: Sequence[tuple[int, ...]], tracked: Sequence[int | None], rank: int) -> int:
    """The output axis the tracked inputs of a broadcasting primitive share; clean inputs must broadcast there."""
    found = {rank - len(shape) + axis for shape, axis in zip(shapes, tracked, strict=True) if axis is not None}
    if len(found) != 1:
        raise NotProven("padded axes of its inputs do not line up")
    (axis,) = found
    for shape, own in zip(shapes, tracked, strict=True):
        position = axis - (rank - len(shape))
        if own is None and position >= 0 and shape[position] != 1:
            raise NotProven(f"an input not derived from the padded one has size {shape[position]} on the padded "
                            "axis")  # fmt: skip
    return axis


def _rule(node: Node, graph: Graph, shapes: list[tuple[int, ...]], tracked: list[int | None],
          size: int) -> list[int | None]:  # fmt: skip
    prim, attr = node.prim, node.attr
    out_rank = graph.types[node.outputs[0]].rank
    if prim in ("gather", "gather_elements", "matmul", "concat") or (len(node.outputs) == 1 and _elementwise(prim)):
        return _multi_input_rule(node, graph, shapes, tracked, out_rank)
    if tracked[0] is None:
        raise NotProven("a parameter comes from the padded input")
    first: int = tracked[0]
    if prim in ("reduce_sum", "reduce_max", "reduce_min", "reduce_prod"):
        if first in attr("axes"):
            raise NotProven("reduces over the padded axis")
        return [first]
    if prim in ("window_max", "window_sum"):
        if first >= len(shapes[0]) - len(attr("kernel")):
            raise NotProven("slides its window over the padded axis")
        return [first]
    if prim in ("transpose",):
        return [list(attr("perm")).index(first)]
    if prim == "reshape":
        return [_reshaped_axis(shapes[0], first, tuple(attr("shape")), size)]
    if prim in ("slice",):
        start, stop, step = attr("ranges")[first]
        if (start, step) != (0, 1) or stop < size:
            raise NotProven("slices the padded axis")
        return [first]
    if prim == "pad":
        pads = attr("pads")
        if pads[first] or pads[len(shapes[0]) + first]:
            raise NotProven("pads the padded axis")
        return [first]
    if prim in ("split", "top_k", "cumsum"):
        if attr("axis") == first:
            raise NotProven("works along the padded axis")
        return [first] * len(node.outputs)
    if prim == "expand":
        return [out_rank - len(shapes[0]) + first]
    if prim == "resize":
        if graph.types[node.outputs[0]].shape[first] != shapes[0][first]:
            raise NotProven("resizes the padded axis")
        if any(a is not None for a in tracked[1:]):
            raise NotProven("its sizes come from the padded input")
        return [first]
    if prim in ("conv", "conv_transpose"):
        if first != 0 or any(a is not None for a in tracked[1:]):
            raise NotProven("the padded axis is not its batch axis")
        return [0]
    raise NotProven("no proof that it keeps rows apart")


def _multi_input_rule(node: Node, graph: Graph, shapes: list[tuple[int, ...]], tracked: list[int | None],
                      out_rank: int) -> list[int | None]:  # fmt: skip
    """The primitives whose padded input may be any of theirs."""
    prim, attr = node.prim, node.attr
    if prim == "gather":
        data, indices = tracked[0], tracked[1]
        axis = attr("axis")
        if data is not None and indices is not None:
            raise NotProven("gathers padded rows with padded indices")
        if indices is not None:
            return [axis + indices]
        if data == axis:
            raise NotProven("gathers along the padded axis")
        if data is None:
            raise NotProven("no padded input")
        return [data if data < axis else data + len(shapes[1]) - 1]
    if prim == "gather_elements":
        if attr("axis") in tracked:
            raise NotProven("gathers along the padded axis")
        return [_broadcast_axis(shapes, tracked, out_rank)]
    if prim == "matmul":
        return [_matmul_axis(shapes, tracked, out_rank)]
    if prim == "concat":
        if len(set(tracked)) != 1:
            raise NotProven("padded axes of its inputs do not line up")
        first = tracked[0]
        if attr("axis") == first:
            raise NotProven("joins along the padded axis")
        return [first]
    return [_broadcast_axis(shapes, tracked, out_rank)]


def _elementwise(prim: str) -> bool:
    from kernorch.ir.primitives import PRIMITIVES, Kind

    return PRIMITIVES[prim].kind == Kind.ELEMENTWISE


def _reshaped_axis(shape: tuple[int, ...], axis: int, new_shape: tuple[int, ...], size: int) -> int:
    """A reshape keeps rows apart when the output has an axis of the same size behind the same number of
    elements (row-major order then maps row i to row i)."""
    before = int(np.prod(shape[:axis], dtype=np.int64))
    for position, dim in enumerate(new_shape):
        if dim == size and int(np.prod(new_shape[:position], dtype=np.int64)) == before:
            return position
    raise NotProven("merges or splits the padded axis")


def _matmul_axis(shapes: Sequence[tuple[int, ...]], tracked: Sequence[int | None], rank: int) -> int:
    (a_shape, b_shape), (a_axis, b_axis) = shapes, tracked
    if len(a_shape) < 2 or len(b_shape) < 2:
        raise NotProven("a vector operand")
    if a_axis == len(a_shape) - 1 or b_axis == len(b_shape) - 2:
        raise NotProven("contracts over the padded axis")
    if a_axis == len(a_shape) - 2:  # rows of A: B must not depend on them
        if b_axis is not None:
            raise NotProven("both operands padded, one on its rows")
        return rank - 2
    if b_axis == len(b_shape) - 1:
        if a_axis is not None:
            raise NotProven("both operands padded, one on its columns")
        return rank - 1
    batch = [s[:-2] for s in shapes]
    return _broadcast_axis(batch, tracked, rank - 2)
