"""Strided views: what the strides say is read equals what the chain of layout primitives computes (numpy),
and a chain that would need a copy is refused."""

from __future__ import annotations

import random

import numpy as np
import pytest

from kernorch.ir.graph import AttrValue, Graph, Node
from kernorch.ir.primitives import PRIMITIVES
from kernorch.ir.strided import reshaped_strides, row_major, strided_view
from kernorch.ir.types import TensorType


def read(buffer: np.ndarray, offset: int, shape: tuple[int, ...], strides: tuple[int, ...]) -> np.ndarray:
    """The elements a strided reader sees: flat buffer, element offset and strides."""
    itemsize = buffer.itemsize
    return np.lib.stride_tricks.as_strided(buffer[offset:], shape, tuple(s * itemsize for s in strides)).copy()


def test_reshape_of_evenly_spaced_axes_is_a_view_and_of_a_transposed_pair_is_not() -> None:
    # [128, 1152] sliced to 384 columns, then [128, 6, 64]: rows stay 1152 apart, heads 64
    assert reshaped_strides((128, 384), (1152, 1), (128, 6, 64)) == (1152, 64, 1)
    assert reshaped_strides((6, 128, 64), (64, 1152, 1), (6, 128 * 64)) is None  # rows and heads interleave
    assert reshaped_strides((4, 6), (1, 4), (24,)) is None  # a transposed matrix flattened
    assert reshaped_strides((4, 6), (6, 1), (2, 2, 6)) == (12, 6, 1)
    assert reshaped_strides((1, 5, 1), (5, 1, 1), (5,)) == (1,)
    assert reshaped_strides((5,), (1,), (1, 5, 1)) == (5, 1, 5)  # size-1 axes get the extent


@pytest.mark.parametrize("seed", range(60))
def test_reshaped_strides_agree_with_numpy_views(seed: int) -> None:
    rng = random.Random(seed)
    shape = tuple(rng.choice([1, 2, 3, 4, 6]) for _ in range(rng.randint(2, 4)))
    base = np.arange(int(np.prod(shape)) * 2, dtype=np.float32)
    array = base[: int(np.prod(shape))].reshape(shape).transpose(rng.sample(range(len(shape)), len(shape)))
    if rng.random() < 0.5:  # a step along the first axis
        array = array[::2] if array.shape[0] > 1 else array
    new_shape = list(array.shape)
    rng.shuffle(new_shape)
    if len(new_shape) > 1 and rng.random() < 0.5:
        new_shape = [new_shape[0] * new_shape[1], *new_shape[2:]]
    strides = tuple(s // 4 for s in array.strides)
    offset = (array.__array_interface__["data"][0] - base.__array_interface__["data"][0]) // 4
    ours = reshaped_strides(array.shape, strides, tuple(new_shape))
    expected = array.reshape(new_shape)
    if ours is not None:
        np.testing.assert_array_equal(read(base, offset, tuple(new_shape), ours), expected)
    try:  # numpy finds a view exactly when the axes are evenly spaced: so must we
        np.reshape(array, new_shape, copy=False)
        numpy_view = True
    except ValueError:
        numpy_view = False
    assert (ours is not None) == numpy_view


def _chain_graph(rng: random.Random) -> tuple[Graph, str]:
    """A random chain of layout primitives from x (one output of each split continues the chain)."""
    shape = tuple(rng.choice([2, 3, 4, 6]) for _ in range(3))
    graph = Graph(inputs=["x"], types={"x": TensorType(shape, "float32")})
    value = "x"
    for step in range(rng.randint(1, 4)):
        shape = graph.types[value].shape
        prim = rng.choice(["transpose", "reshape", "slice", "split"])
        attrs: dict[str, AttrValue]
        if prim == "transpose":
            attrs = {"perm": tuple(rng.sample(range(len(shape)), len(shape)))}
        elif prim == "reshape":
            flat = list(shape)
            rng.shuffle(flat)
            attrs = {"shape": tuple(flat)}
        elif prim == "slice":
            attrs = {"ranges": tuple((rng.randrange(d), d, rng.choice([1, 1, 2])) if d > 1 else (0, 1, 1)
                                     for d in shape)}  # fmt: skip
        else:
            axis = max(range(len(shape)), key=lambda a: shape[a])
            first = rng.randint(1, shape[axis] - 1)
            attrs = {"axis": axis, "sizes": (first, shape[axis] - first)}
        outputs = (f"v{step}",) if prim != "split" else (f"v{step}a", f"v{step}b")
        node = Node(prim, (value,), outputs, tuple(sorted(attrs.items())))
        for out, out_type in zip(outputs, PRIMITIVES[prim].infer([graph.types[value]], dict(attrs)), strict=True):
            graph.types[out] = out_type
        graph.nodes.append(node)
        value = rng.choice(outputs)
    graph.outputs = [value]
    return graph, value


@pytest.mark.parametrize("seed", range(80))
def test_a_chain_read_through_its_view_equals_the_chain_computed(seed: int) -> None:
    from kernorch.runtime import run_reference

    graph, value = _chain_graph(random.Random(seed))
    x = np.random.default_rng(seed).standard_normal(graph.types["x"].shape).astype(np.float32)
    view = strided_view(graph, set(range(len(graph.nodes))), value)
    if view is None:  # some reshape needs a copy: it must be a reshape over unevenly spaced axes
        assert any(node.prim == "reshape" for node in graph.nodes)
        return
    assert view.source == "x" and view.nodes == tuple(range(len(graph.nodes)))
    expected = run_reference(graph, {"x": x})[value]
    np.testing.assert_array_equal(read(x.reshape(-1), view.offset, view.shape, view.strides), expected)


def test_views_are_found_often_enough_to_matter() -> None:
    found = sum(strided_view(*_graph_and_nodes(seed)) is not None for seed in range(80))
    assert found >= 40, found


def _graph_and_nodes(seed: int) -> tuple[Graph, set[int], str]:
    graph, value = _chain_graph(random.Random(seed))
    return graph, set(range(len(graph.nodes))), value


def test_the_chain_stops_at_the_kernel_boundary() -> None:
    graph = Graph(inputs=["x"], types={"x": TensorType((4, 6), "float32")})
    graph.nodes = [Node("transpose", ("x",), ("t",), (("perm", (1, 0)),)),
                   Node("reshape", ("t",), ("r",), (("shape", (3, 8)),))]  # fmt: skip
    graph.types.update({"t": TensorType((6, 4), "float32"), "r": TensorType((3, 8), "float32")})
    assert strided_view(graph, {0, 1}, "r") is None  # a transposed matrix reshaped: a copy
    view = strided_view(graph, {0}, "t")
    assert view is not None and (view.source, view.strides) == ("x", (1, 6))
    assert strided_view(graph, set(), "t") is None
    assert row_major((2, 3, 4)) == (12, 4, 1)
