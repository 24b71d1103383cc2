"""Views: a slice is a view exactly when numpy's slice of a row-major array is one contiguous run, at the same
offset; reshape, contiguous slice and split kernels run as views and compute what the reference computes."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest

from kernorch.codegen.backends import GENERATED_C, VIEW, choose_backend
from kernorch.codegen.views import contiguous_block
from kernorch.ir.graph import Graph, Node
from kernorch.ir.kernel import make_kernel
from kernorch.ir.types import TensorType
from kernorch.runtime.executor import PlanExecutor
from kernorch.runtime.reference import run_reference


def _axis_ranges(dim: int) -> list[tuple[int, int, int]]:
    ranges = {slice(start, stop, step).indices(dim) for start in range(-1, dim + 1) for stop in range(-1, dim + 2)
              for step in (1, 2, -1)}  # fmt: skip
    return sorted(ranges)


@pytest.mark.parametrize("shape", [(3,), (1, 4), (2, 3), (1, 3, 2), (2, 1, 3), (2, 2, 2)])
def test_contiguous_block_agrees_with_numpy(shape: tuple[int, ...]) -> None:
    data = np.arange(int(np.prod(shape))).reshape(shape)
    for ranges in itertools.product(*(_axis_ranges(d) for d in shape)):
        index = tuple(slice(start, stop if stop >= 0 else None, step) for start, stop, step in ranges)
        piece = data[index]
        offset = contiguous_block(shape, ranges)
        contiguous = piece.size > 0 and piece.flags.c_contiguous
        expected = (piece.__array_interface__["data"][0] - data.__array_interface__["data"][0]) // data.itemsize
        assert (offset is not None) == contiguous, (ranges, offset)
        if offset is not None:
            assert offset == expected
            assert np.array_equal(data.reshape(-1)[offset: offset + piece.size].reshape(piece.shape), piece)


def _graph(prim: str, attrs: dict, in_shape: tuple[int, ...], out_shapes: list[tuple[int, ...]]) -> Graph:
    outputs = [f"y{i}" for i in range(len(out_shapes))]
    graph = Graph(inputs=["x"], outputs=["z", *outputs[1:]], name=prim)
    graph.types = {"x": TensorType(in_shape, "float32"), "t": TensorType(in_shape, "float32")}
    graph.types.update({o: TensorType(s, "float32") for o, s in zip(outputs, out_shapes, strict=True)})
    graph.types["z"] = graph.types["y0"]
    graph.nodes = [Node("tanh", ("x",), ("t",)), Node(prim, ("t",), tuple(outputs), tuple(sorted(attrs.items()))),
                   Node("exp", ("y0",), ("z",))]  # fmt: skip
    return graph


CASES: dict[str, tuple[str, dict[str, Any], tuple[int, ...], list[tuple[int, ...]]]] = {
    "reshape": ("reshape", {"shape": (6, 4)}, (2, 3, 4), [(6, 4)]),
    "slice rows": ("slice", {"ranges": ((1, 3, 1), (0, 4, 1))}, (4, 4), [(2, 4)]),
    "slice one row, part": ("slice", {"ranges": ((2, 3, 1), (1, 3, 1))}, (4, 4), [(1, 2)]),
    "split channels": ("split", {"axis": 1, "sizes": (2, 3)}, (1, 5, 2, 2), [(1, 2, 2, 2), (1, 3, 2, 2)]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_view_kernels_alias_and_compute_the_same(case: str) -> None:
    prim, attrs, in_shape, out_shapes = CASES[case]
    graph = _graph(prim, attrs, in_shape, out_shapes)
    view = make_kernel(graph, (1,), graph.nodes[1].outputs if prim != "split" else ("y0", "y1"))
    kernels = [make_kernel(graph, (0,), ("t",)), view, make_kernel(graph, (2,), ("z",))]
    assert choose_backend(view)[0] is VIEW
    executor = PlanExecutor(graph, kernels)
    assert np.shares_memory(executor.buffers["y0"], executor.buffers["t"])
    x = np.random.default_rng(0).standard_normal(in_shape).astype(np.float32)
    expected = run_reference(graph, {"x": x})
    actual = executor({"x": x})
    for name in graph.outputs:
        np.testing.assert_allclose(actual[name], expected[name], rtol=1e-6, atol=1e-6)


def test_a_strided_slice_or_inner_split_is_not_a_view() -> None:
    strided = _graph("slice", {"ranges": ((0, 4, 2), (0, 4, 1))}, (4, 4), [(2, 4)])
    assert choose_backend(make_kernel(strided, (1,), ("y0",)))[0] is GENERATED_C
    inner = _graph("split", {"axis": 1, "sizes": (2, 2)}, (2, 4), [(2, 2), (2, 2)])
    assert choose_backend(make_kernel(inner, (1,), ("y0", "y1")))[0] is GENERATED_C


def _concat_graph(piece_is_view: bool, twice: bool) -> tuple[Graph, list]:
    """a = tanh(x), b = exp(x) (or b = reshape(exp(x)): a view); c = concat(a, b) on channels (batch 1);
    y = sin(c) (and, with `twice`, also d = concat(a, x2) with a placed already)."""
    t, both = TensorType((1, 2, 3), "float32"), TensorType((1, 4, 3), "float32")
    graph = Graph(inputs=["x"], types={"x": t, "a": t, "e": t, "b": t, "c": both, "y": both}, name="concat")
    graph.nodes = [Node("tanh", ("x",), ("a",)), Node("exp", ("x",), ("e",)),
                   Node("reshape", ("e",), ("b",), (("shape", (1, 2, 3)),)) if piece_is_view
                   else Node("neg", ("e",), ("b",)),
                   Node("concat", ("a", "b"), ("c",), (("axis", 1),)), Node("sin", ("c",), ("y",))]  # fmt: skip
    graph.outputs = ["y"]
    if twice:
        graph.nodes += [Node("cos", ("x",), ("f",)), Node("concat", ("f", "a"), ("d",), (("axis", 1),)),
                        Node("add", ("y", "d"), ("z",))]  # fmt: skip
        graph.types.update({"f": t, "d": both, "z": both})
        graph.outputs = ["z"]
    kernels = [make_kernel(graph, (i,), graph.nodes[i].outputs) for i in range(len(graph.nodes))]
    return graph, kernels


@pytest.mark.parametrize("piece_is_view, twice", [(False, False), (True, False), (False, True)])
def test_a_concat_is_placed_inside_its_output_when_the_plan_allows(piece_is_view: bool, twice: bool) -> None:
    from kernorch.runtime.executor import generate_source

    graph, kernels = _concat_graph(piece_is_view, twice)
    concat = next(i for i, n in enumerate(graph.nodes) if n.prim == "concat")
    assert choose_backend(kernels[concat])[0] is VIEW
    executor = PlanExecutor(graph, kernels)
    placed = not piece_is_view
    assert (executor.backends[concat] is VIEW) == placed  # a piece that is a view keeps its bytes: copy
    assert np.shares_memory(executor.buffers["a"], executor.buffers["c"]) == placed
    if twice:  # a is placed in c; the second concat copies it
        assert executor.backends[graph.nodes.index(graph.nodes[-2])] is GENERATED_C
    assert tuple(executor.backends) == generate_source(kernels)[1].backends  # a saved plan regenerates the same code
    x = np.random.default_rng(1).standard_normal((1, 2, 3)).astype(np.float32)
    expected = run_reference(graph, {"x": x})
    for name, value in executor({"x": x}).items():
        np.testing.assert_allclose(value, expected[name], rtol=1e-6, atol=1e-6)
