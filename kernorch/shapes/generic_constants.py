"""Constants that fold a size into a value, made per call for a range's generic plan (shapes/generic.py).

A model imported at a concrete size folds what it computes from its input shapes into constants: a position's
row of an embedding table, a mask as long as the cache, positions 0..S-1 plus the token types. At each probe size
such a constant differs; a generic plan makes it on every call from a generator found here, checked at every
probe: filled with one value, filled with a count that is a polynomial of the sizes or with its reciprocal (a mean's
divisor: a pool over height·width), the leading corner of its value at the largest sizes, or rows of one of the
model's tables (initializers, Constant nodes) at an offset and count that are polynomials of the sizes. Any other
refuses the range, naming the constant.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from functools import cached_property

import numpy as np
from onnx import numpy_helper

from kernorch.codegen.generic import NotGeneric, Polynomial, polynomial_of
from kernorch.errors import KernorchError
from kernorch.frontend.onnx_import import load_proto
from kernorch.ir.graph import Graph
from kernorch.runtime.generic import Generator


def generators(model: bytes, graphs: Sequence[Graph], at: Sequence[Mapping[str, int]],
                dims: Mapping[str, tuple[Polynomial, ...]]) -> dict[str, Generator]:  # fmt: skip
    """A maker for each constant that differs between probes (module doc, 2)."""
    tables = _Tables(model)
    makers: dict[str, Generator] = {}
    for name, array in graphs[0].constants.items():
        arrays = [np.asarray(g.constants[name]) for g in graphs]
        if all(a.shape == array.shape and np.array_equal(a, array, equal_nan=True) for a in arrays[1:]):
            continue
        makers[name] = _filled(name, arrays, dims[name]) or _counted(arrays, at, dims[name]) or \
            _corner(arrays, dims[name]) or tables.rows_of(name, arrays, at, dims[name]) or \
            _refuse_constant(name, arrays)  # fmt: skip
    return makers


def _corner(arrays: Sequence[np.ndarray], shape: tuple[Polynomial, ...]) -> Generator | None:
    """The constant as the leading corner of its value at the largest sizes (`arrays[0]`), at every probe: a
    position table sliced to the sequence (with a constant added: BERT's positions and token types, folded), a
    causal mask cut to the length."""
    largest = arrays[0]
    if not all(a.ndim == largest.ndim and np.array_equal(a, largest[tuple(slice(0, n) for n in a.shape)],
                                                          equal_nan=True) for a in arrays[1:]):  # fmt: skip
        return None

    @functools.lru_cache(maxsize=64)  # a server's lengths repeat: each corner copied once
    def corner(extents: tuple[int, ...]) -> np.ndarray:
        made = np.ascontiguousarray(largest[tuple(slice(0, n) for n in extents)])
        made.flags.writeable = False
        return made

    return lambda sizes: corner(tuple(int(d(sizes)) for d in shape))


def _filled(name: str, arrays: Sequence[np.ndarray], shape: tuple[Polynomial, ...]) -> Generator | None:
    value = arrays[0].reshape(-1)[:1]
    if value.size == 0 or not all(a.size and np.array_equal(a, np.full_like(a, value[0]), equal_nan=True)
                                  for a in arrays):  # fmt: skip
        return None
    fill, dtype = value[0], arrays[0].dtype
    return lambda sizes: np.full(tuple(int(d(sizes)) for d in shape), fill, dtype)


def _counted(arrays: Sequence[np.ndarray], at: Sequence[Mapping[str, int]],
             shape: tuple[Polynomial, ...]) -> Generator | None:  # fmt: skip
    """The constant filled, at every probe, with a count that is a polynomial of the sizes, or with the count's
    reciprocal as its dtype rounds it (how the rewrite folds a division by the count: rewrite/rules/algebra.py)."""
    dtype = arrays[0].dtype
    if dtype.kind != "f" or not all(a.size and np.all(a == a.reshape(-1)[0]) for a in arrays):
        return None
    values = [a.reshape(-1)[0] for a in arrays]
    for reciprocal in (False, True):
        counts = [int(np.rint(1 / v)) if reciprocal and v > 0 else int(np.rint(v)) if np.isfinite(v) else 0
                  for v in values]  # fmt: skip
        if min(counts) < 1:
            continue
        made = [np.reciprocal(dtype.type(n)) if reciprocal else dtype.type(n) for n in counts]
        if any(m.tobytes() != v.tobytes() for m, v in zip(made, values, strict=True)):
            continue
        try:
            count = polynomial_of(at, counts, "a count")
        except NotGeneric:
            return None
        inverse = reciprocal
        return lambda sizes: np.full(tuple(int(d(sizes)) for d in shape),
                                     np.reciprocal(dtype.type(count(sizes))) if inverse else count(sizes), dtype)
    return None


def _refuse_constant(name: str, arrays: Sequence[np.ndarray]) -> Generator:
    raise NotGeneric(f"constant {name} {list(arrays[0].shape)} holds values that follow the size, and no table of "
                     "the model holds them at offsets that are polynomials of it")  # fmt: skip


class _Tables:
    """The model's tensors a size-dependent constant may be rows of: initializers and Constant nodes' values."""

    def __init__(self, model: bytes) -> None:
        self._model = model

    @cached_property
    def arrays(self) -> list[np.ndarray]:
        proto = load_proto(self._model)
        found = [numpy_helper.to_array(t) for t in proto.graph.initializer]
        for node in proto.graph.node:
            if node.op_type == "Constant":
                for attribute in node.attribute:
                    if attribute.name == "value":
                        found.append(numpy_helper.to_array(attribute.t))
        return [a for a in found if a.ndim >= 1 and a.size > 1]

    def rows_of(self, name: str, arrays: Sequence[np.ndarray], at: Sequence[Mapping[str, int]],
                shape: tuple[Polynomial, ...]) -> Generator | None:  # fmt: skip
        """The constant as `table[offset : offset + count]` (rows of the table's first axis), offset and count
        polynomials of the sizes, if some table holds it so at every probe."""
        for table in self.arrays:
            if table.dtype != arrays[0].dtype:
                continue
            rows = table.reshape(table.shape[0], -1)
            found = [_row_offset(rows, a) for a in arrays]
            if any(f is None for f in found):
                continue
            offsets = [f[0] for f in found if f is not None]
            counts = [f[1] for f in found if f is not None]
            try:
                offset, count = polynomial_of(at, offsets, "offset"), polynomial_of(at, counts, "count")
            except NotGeneric:
                continue
            return _rows_generator(rows, offset, count, shape)
        return None


def _row_offset(rows: np.ndarray, array: np.ndarray) -> tuple[int, int] | None:
    width = rows.shape[1]
    if array.size == 0 or array.size % width:
        return None
    wanted = array.reshape(-1, width)
    starts = np.flatnonzero(np.all(rows == wanted[0], axis=1))
    for start in starts:
        if start + len(wanted) <= len(rows) and np.array_equal(rows[start: start + len(wanted)], wanted):
            return int(start), len(wanted)
    return None


def _rows_generator(rows: np.ndarray, offset: Polynomial, count: Polynomial,
                    shape: tuple[Polynomial, ...]) -> Generator:  # fmt: skip
    def make(sizes: Mapping[str, int]) -> np.ndarray:
        start, length = int(offset(sizes)), int(count(sizes))
        if start < 0 or start + length > len(rows):
            raise KernorchError(f"the sizes {dict(sizes)} reach beyond the model's table of {len(rows)} rows")
        return rows[start: start + length].reshape(tuple(int(d(sizes)) for d in shape))

    return make
