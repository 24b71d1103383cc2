"""A model's input signature with its symbolic dims, and the binding of concrete shapes to it.

ONNX declares each input dim as a number, a name (`batch`, `sequence`: the same name on two inputs is the same
size) or nothing. kernorch plans static shapes, so a model with symbolic dims is specialised per concrete shape
(kernorch/shapes/); this module says which dims are free and checks that a shape set fits them.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import onnx

from kernorch.errors import InputMismatch, ShapeError
from kernorch.frontend.onnx_import import load_proto, onnx_dtype_name

Dim = int | str  # a size, or the name of a symbolic dim
ShapeSet = tuple[tuple[str, tuple[int, ...]], ...]  # input name -> concrete shape, sorted by name: a dict key


@dataclass(frozen=True)
class InputSignature:
    name: str
    dims: tuple[Dim, ...]
    dtype: str

    @property
    def symbols(self) -> tuple[str, ...]:
        return tuple(d for d in self.dims if isinstance(d, str))

    def describe(self) -> str:
        return f"{self.name}: {self.dtype}[{', '.join(map(str, self.dims))}]"


def input_signature(source: str | os.PathLike[str] | bytes | onnx.ModelProto) -> list[InputSignature]:
    """The model's inputs (initializers excluded) with their declared dims; an unnamed symbolic dim gets the
    name `INPUT.AXIS` (it matches no other input's dim)."""
    proto = load_proto(source)
    constants = {t.name for t in proto.graph.initializer}
    inputs = []
    for value in proto.graph.input:
        if value.name in constants or not value.type.HasField("tensor_type"):
            continue
        tensor_type = value.type.tensor_type
        if not tensor_type.HasField("shape"):
            raise ShapeError(f"input '{value.name}' declares no shape (not even its rank); kernorch needs the rank")
        dims: list[Dim] = []
        for axis, dim in enumerate(tensor_type.shape.dim):
            if dim.HasField("dim_value"):
                dims.append(int(dim.dim_value))
            else:
                dims.append(dim.dim_param or f"{value.name}.{axis}")
        inputs.append(InputSignature(value.name, tuple(dims), onnx_dtype_name(tensor_type.elem_type, value.name)))
    return inputs


def is_dynamic(signature: Iterable[InputSignature]) -> bool:
    return any(s.symbols for s in signature)


def symbols_of(signature: Iterable[InputSignature]) -> list[str]:
    """Every symbolic dim name, in order of first appearance."""
    seen: dict[str, None] = {}
    for entry in signature:
        seen.update(dict.fromkeys(entry.symbols))
    return list(seen)


def shape_set(shapes: Mapping[str, Sequence[int]]) -> ShapeSet:
    return tuple(sorted((name, tuple(int(d) for d in shape)) for name, shape in shapes.items()))


def describe_shapes(shapes: ShapeSet) -> str:
    return ", ".join(f"{name}={'x'.join(map(str, shape)) or 'scalar'}" for name, shape in shapes)


def bind(signature: Sequence[InputSignature], shapes: Mapping[str, Sequence[int]],
         empty: bool = False) -> dict[str, int]:  # fmt: skip
    """The value of every symbolic dim under `shapes` (one shape per input); a shape that contradicts the
    signature — another rank, another static size, one symbol two sizes — is refused in one line, and so is an
    empty axis unless `empty` (a call onnxruntime serves: kernorch plans non-empty tensors)."""
    by_name = {s.name: s for s in signature}
    unknown = sorted(set(shapes) - set(by_name))
    if unknown:
        raise InputMismatch(f"unknown input '{unknown[0]}' (the model's inputs are {sorted(by_name)})")
    values: dict[str, int] = {}
    for entry in signature:
        if entry.name not in shapes:
            raise InputMismatch(f"missing input '{entry.name}' ({entry.describe()})")
        shape = tuple(shapes[entry.name])
        if len(shape) != len(entry.dims):
            raise InputMismatch(f"input '{entry.name}' has rank {len(shape)}, the model declares {entry.describe()}")
        for axis, (dim, size) in enumerate(zip(entry.dims, shape, strict=True)):
            if isinstance(dim, int):
                if dim != size:
                    raise InputMismatch(f"input '{entry.name}' has size {size} on axis {axis}, the model declares "
                                        f"{entry.describe()}")  # fmt: skip
            elif values.setdefault(dim, size) != size:
                raise InputMismatch(f"symbolic dim '{dim}' is {values[dim]} in one input and {size} in "
                                    f"'{entry.name}' (axis {axis})")  # fmt: skip
            if size < 1 and not empty:
                raise InputMismatch(f"input '{entry.name}' has an empty axis {axis}; kernorch plans non-empty "
                                    "tensors")  # fmt: skip
    return values


def shapes_for(signature: Sequence[InputSignature], values: Mapping[str, int]) -> ShapeSet:
    """The concrete shape of every input once each symbolic dim has a value (all must have one)."""
    missing = [s for s in symbols_of(signature) if s not in values]
    if missing:
        raise ShapeError(f"symbolic dim '{missing[0]}' has no size (give it with --input-shape or --dim)")
    return shape_set({s.name: tuple(d if isinstance(d, int) else values[d] for d in s.dims) for s in signature})


def parse_shape_sets(specs: Sequence[str] | None) -> list[dict[str, tuple[int, ...]]]:
    """`--input-shape` given repeatedly: the k-th shape of an input goes to the k-th shape set, and an input
    named once is in every set (`--input-shape ids=1x32 --input-shape ids=1x64 --input-shape mask=1x1`)."""
    from kernorch.frontend.onnx_import import parse_input_shapes

    per_input: dict[str, list[tuple[int, ...]]] = {}
    for spec in specs or []:
        for name, shape in parse_input_shapes([spec]).items():
            per_input.setdefault(name, []).append(shape)
    count = max((len(v) for v in per_input.values()), default=0)
    uneven = [name for name, v in per_input.items() if len(v) not in (1, count)]
    if uneven:
        raise ShapeError(f"--input-shape gives '{uneven[0]}' {len(per_input[uneven[0]])} shapes and another input "
                         f"{count}; give each input once or as many times as the others")  # fmt: skip
    return [{name: v[k if len(v) > 1 else 0] for name, v in per_input.items()} for k in range(count)]


MAX_DIM_SIZES = 64  # sizes one --dim may name: each is a plan to prepare (options.MAX_BUCKETED_SHAPES bounds all)


def parse_dim_buckets(specs: Sequence[str] | None) -> dict[str, tuple[int, ...]]:
    """`--dim NAME=SIZES`: `batch=1,2,4,8`, `batch=pow2:1..16` (powers of two) or `sequence=x64:64..512`
    (multiples of 64)."""
    buckets: dict[str, tuple[int, ...]] = {}
    for spec in specs or []:
        name, sep, sizes = spec.partition("=")
        try:
            if not sep or not name or not sizes:
                raise ValueError
            if ":" in sizes:
                rule, _, bounds = sizes.partition(":")
                low, _, high = bounds.partition("..")
                first, last = int(low), int(high)
                if rule == "pow2":
                    values = [1 << k for k in range(64) if first <= 1 << k <= last]
                elif rule.startswith("x") and int(rule[1:]) > 0:
                    step = int(rule[1:])
                    start = -(-first // step) * step
                    if (last - start) // step >= MAX_DIM_SIZES:  # counted before a list of them is made
                        raise ShapeError(f"--dim '{spec[:60]}' names more than {MAX_DIM_SIZES} sizes; give fewer")
                    values = list(range(start, last + 1, step))
                else:
                    raise ValueError
            else:
                values = [int(v) for v in sizes.split(",")]
            if not values or min(values) < 1:
                raise ValueError
        except ValueError:
            raise ShapeError(f"bad --dim '{spec[:60]}': expected NAME=1,2,4 or NAME=pow2:1..16 or NAME=x64:64..512 "
                             "(positive sizes)") from None
        buckets[name] = tuple(sorted(set(values)))
    return buckets
