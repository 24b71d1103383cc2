"""The static memory plan: values alive at the same time never share bytes, and sharing pays."""

from __future__ import annotations

import random

import numpy as np
import pytest

from kernorch.codegen.backends import VIEW
from kernorch.devtools.mutate import here
from kernorch.ir.graph import Graph, Node
from kernorch.ir.kernel import make_kernel
from kernorch.ir.types import TensorType
from kernorch.runtime.executor import PlanExecutor
from kernorch.runtime.executor_test import random_graph, random_plan
from kernorch.runtime.memory import ALIGNMENT, aligned_buffer, aligned_copy, aligned_empty, allocate, plan_memory
from kernorch.runtime.reference import run_reference


@pytest.mark.parametrize("seed", range(60))
def test_values_alive_together_never_overlap(seed: int) -> None:
    rng = random.Random(seed)
    graph = random_graph(rng, rng.randint(3, 8))
    kernels = random_plan(graph, rng)
    plan = plan_memory(graph, kernels)
    assert not set(plan.placements) & (set(graph.inputs) | set(graph.outputs) | set(graph.constants))
    for k, kernel in enumerate(kernels):  # every value a kernel touches is alive during it
        for value in (*kernel.inputs, *kernel.outputs):
            if value in plan.placements:
                assert plan.placements[value].first <= k <= plan.placements[value].last
    items = list(plan.placements.items())
    for i, (a, pa) in enumerate(items):
        assert pa.offset % ALIGNMENT == 0 and pa.nbytes >= graph.types[a].nbytes
        for b, pb in items[i + 1 :]:
            alive_together = pa.first <= pb.last and pb.first <= pa.last
            overlap = pa.offset < pb.offset + pb.nbytes and pb.offset < pa.offset + pa.nbytes
            assert not (alive_together and overlap), (a, pa, b, pb)
    _, views = allocate(graph, plan)
    assert all(view.ctypes.data % ALIGNMENT == 0 for view in views.values())


def test_a_chain_needs_two_buffers_and_computes_the_same() -> None:
    """exp applied 6 times, one kernel each: the intermediates alternate between two places."""
    t = TensorType((64, 64), "float32")
    graph = Graph(inputs=["x"], types={"x": t}, name="chain")
    previous = "x"
    for i in range(6):
        graph.nodes.append(Node("tanh", (previous,), (f"v{i}",)))
        graph.types[f"v{i}"] = t
        previous = f"v{i}"
    graph.outputs = [previous]
    kernels = [make_kernel(graph, (i,), (f"v{i}",)) for i in range(6)]
    plan = plan_memory(graph, kernels)
    assert plan.arena_bytes == 2 * t.nbytes and plan.unshared_bytes == 5 * t.nbytes
    x = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    np.testing.assert_allclose(PlanExecutor(graph, kernels)({"x": x})[previous],
                               run_reference(graph, {"x": x})[previous], rtol=1e-6)  # fmt: skip


def _view_graph(view_is_output: bool) -> tuple[Graph, list]:
    """a = tanh(x); b = reshape(a) (a view); c, d = later intermediates of a's size that could take a's bytes
    if a's life ended at the view; the output reads b (or b is itself an output)."""
    t, flat = TensorType((32, 32), "float32"), TensorType((1024,), "float32")
    graph = Graph(inputs=["x"], types={"x": t, "a": t, "b": flat, "c": t, "d": t, "e": flat}, name="view")
    graph.nodes = [Node("tanh", ("x",), ("a",)), Node("reshape", ("a",), ("b",), (("shape", (1024,)),)),
                   Node("exp", ("x",), ("c",)), Node("sin", ("c",), ("d",)),
                   Node("reshape", ("d",), ("e",), (("shape", (1024,)),))]  # fmt: skip
    kernels = [make_kernel(graph, (i,), graph.nodes[i].outputs) for i in range(4)]
    if view_is_output:
        graph.outputs = ["b", "d"]
    else:
        graph.nodes.append(Node("add", ("b", "e"), ("y",)))
        graph.types["y"] = flat
        graph.outputs = ["y"]
        kernels += [make_kernel(graph, (4,), ("e",)), make_kernel(graph, (5,), ("y",))]
    return graph, kernels


@pytest.mark.parametrize("view_is_output", [False, True])
def test_a_view_shares_its_source_and_keeps_it_alive(view_is_output: bool) -> None:
    graph, kernels = _view_graph(view_is_output)
    executor = PlanExecutor(graph, kernels)
    assert executor.backends[1] is VIEW
    assert "b" not in executor.memory.placements  # type: ignore[union-attr]  # no bytes of its own
    assert np.shares_memory(executor.buffers["b"], executor.buffers["a"])
    a = executor.memory.placements["a"]  # type: ignore[union-attr]
    assert a.last == (len(kernels) if view_is_output else len(kernels) - 1)
    x = np.random.default_rng(3).standard_normal((32, 32)).astype(np.float32)
    expected = run_reference(graph, {"x": x})
    for name, value in executor({"x": x}).items():
        np.testing.assert_allclose(value, expected[name], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(("shape", "dtype"), [((), "float32"), ((0, 3), "float32"), ((3, 5), "int8"),
                                              ((7, 9), "bfloat16"), ((1000,), "float64")])  # fmt: skip
def test_aligned_arrays_start_on_a_cache_line(shape: tuple[int, ...], dtype: str) -> None:
    for _ in range(8):  # numpy's own allocations land anywhere 16 bytes apart
        array = aligned_empty(shape, dtype)
        assert array.shape == shape and array.dtype == np.dtype(dtype) and array.flags.c_contiguous
        assert array.ctypes.data % ALIGNMENT == 0 or array.size == 0
        array, address = aligned_buffer(shape, dtype)  # the address the executor binds for an output
        assert array.shape == shape and address % ALIGNMENT == 0
        assert address == array.ctypes.data or array.size == 0  # numpy may place an empty view anywhere
    source = np.arange(int(np.prod(shape)), dtype=np.float64).astype(dtype).reshape(shape)
    np.testing.assert_array_equal(aligned_copy(source[()] if not shape else source), source)


def test_every_buffer_the_kernels_read_or_write_starts_on_a_cache_line() -> None:
    """Constants, the inputs' and outputs' own buffers, the arena's values and the arrays a call returns where the
    kernels write them: a weight 32 bytes past a line made lstm_tc's recurrences 1.6x slower."""
    graph, kernels = _view_graph(view_is_output=True)
    graph.constants["w"] = np.arange(1024, dtype=np.float32)[1:1001].reshape(1000)  # a view 4 bytes in
    graph.types["w"] = TensorType((1000,), "float32")
    executor = PlanExecutor(graph, kernels)
    misaligned = {name: buffer.ctypes.data % ALIGNMENT for name, buffer in executor.buffers.items()
                  if name not in executor.views and buffer.ctypes.data % ALIGNMENT}  # fmt: skip
    assert not misaligned
    x = np.random.default_rng(0).standard_normal((32, 32)).astype(np.float32)
    outputs = executor({"x": x})
    assert executor._output_slots  # noqa: SLF001 - the outputs written in the caller's arrays
    for name in executor._output_slots:  # noqa: SLF001 - (the others are copies of the workspace's buffers)
        assert outputs[name].ctypes.data % ALIGNMENT == 0, name


# The mutants of the code this file tests, each a one-line change a real bug could make and that these tests must
# catch (`make mutate`: kernorch/devtools/mutate.py collects them)
MUTANTS = [
    here("buffers start where numpy puts them (16 bytes), not on a cache line",
         "shift = (-start) % ALIGNMENT\n    return",
         "shift = 0\n    return"),
]  # fmt: skip
