"""Split reductions (reductions.py): a long reduction with nothing around it to share out is split among
threads, combined in thread order; checked in the emitted source and in the numbers the kernel computes."""

from __future__ import annotations

import numpy as np
import pytest

from kernorch.codegen.backends import GENERATED_C
from kernorch.ir.graph import Graph, Node
from kernorch.ir.kernel import make_kernel
from kernorch.ir.types import TensorType
from kernorch.runtime.executor import PlanExecutor
from kernorch.runtime.reference import run_reference


def _centred_graph(shape: tuple[int, ...], prim: str) -> Graph:
    """x − reduce(x) over the spatial axes of a channels-last map: an instance norm's first step."""
    graph = Graph(inputs=["x"], outputs=["y"])
    reduced = (shape[0], 1, 1, shape[3])
    graph.types.update(x=TensorType(shape, "float32"), m=TensorType(reduced, "float32"),
                       y=TensorType(shape, "float32"))  # fmt: skip
    graph.nodes += [Node(prim, ("x",), ("m",), (("axes", (1, 2)),)), Node("sub", ("x", "m"), ("y",), ())]
    return graph


@pytest.mark.parametrize(("prim", "width", "block"), [("reduce_sum", 80, 8), ("reduce_max", 80, 8),
                                                     ("reduce_sum", 77, 7), ("reduce_max", 79, 1)])
def test_a_reduction_with_nothing_around_it_is_split_among_threads(prim: str, width: int, block: int) -> None:
    """... and sums `block` consecutive taps of its innermost tap loop (the largest divisor of its length up to 8;
    none for a prime) in a register before the running value goes back to memory."""
    graph = _centred_graph((1, 96, width, 40), prim)
    kernel = make_kernel(graph, (0, 1), ("y",))
    source = GENERATED_C.source("k", kernel)
    # each thread's 40 results padded to 48 floats (whole cache lines): no line shared between two threads
    assert "ko_parts[ko_team][48] __attribute__((aligned(64)))" in source, source
    assert "#pragma omp for collapse(2) schedule(static)" in source, source
    assert (f"ko_r2 += {block}) {{" in source) == (block > 1), source
    assert ("float ko_run = ko_part[l3];" in source) == (block > 1), source
    x = np.random.default_rng(0).standard_normal((1, 96, width, 40)).astype(np.float32)
    x[0, 95, width - 1, 3] = 50.0  # the maximum of channel 3 in the last thread's part, the last tap of a block
    executor = PlanExecutor(graph, [kernel], threads=2)
    got = executor({"x": x})["y"].copy()
    expected = run_reference(graph, {"x": x})["y"]
    atol = 1e-6 * float(np.abs(expected).max())  # a sum of 7680 values: float32 rounding of the sum
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=atol)
    np.testing.assert_array_equal(executor({"x": x})["y"], got)  # same threads, same order of summation
    single = PlanExecutor(graph, [kernel], threads=1)({"x": x})["y"]
    np.testing.assert_allclose(single, got, rtol=1e-5, atol=atol)


def test_a_reduction_with_a_batch_to_share_out_is_not_split() -> None:
    """The batch is shared out; each image's sums run in a local array, 8 taps at a time in a register."""
    graph = _centred_graph((4, 48, 40, 40), "reduce_sum")
    kernel = make_kernel(graph, (0, 1), ("y",))
    source = GENERATED_C.source("k", kernel)
    assert "ko_parts" not in source and "float ko_run = ko_acc[l3];" in source and "ko_r2 += 8) {" in source, source
    x = np.random.default_rng(1).standard_normal((4, 48, 40, 40)).astype(np.float32)
    got = PlanExecutor(graph, [kernel], threads=2)({"x": x})["y"]
    expected = run_reference(graph, {"x": x})["y"]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6 * float(np.abs(expected).max()))


def test_rtasks_keep_the_reduction_whole() -> None:
    """An rTask runs a share of a phase's iterations on its own: a split would need a combining step."""
    graph = _centred_graph((1, 96, 80, 40), "reduce_sum")
    tasked = GENERATED_C.task_source("k_task", make_kernel(graph, (0, 1), ("y",)))
    assert tasked is not None and "ko_parts" not in tasked[0]


@pytest.mark.parametrize(("prim", "channels"), [("window_max", 24), ("window_max", 37), ("window_sum", 24)])
def test_a_channels_last_pool_accumulates_in_a_local_array_and_keeps_nan(prim: str, channels: int) -> None:
    """A channels-last 3x3 stride-2 pool runs interchanged: the taps outside (written out), the channels inside,
    the running values in `ko_acc` (stored once). A NaN in the window's first tap, in a later one, or in the
    channel tail reaches the output; -inf and the padding do not."""
    graph = Graph(inputs=["x"], outputs=["y"])
    graph.types.update(x=TensorType((1, 15, 13, channels), "float32"), y=TensorType((1, 8, 7, channels), "float32"))
    attrs = (("kernel", (3, 3, 1)), ("strides", (2, 2, 1)), ("dilations", (1, 1, 1)), ("pads", (1, 1, 0, 1, 1, 0)),
             ("ceil_mode", False))  # fmt: skip
    graph.nodes.append(Node(prim, ("x",), ("y",), attrs))
    kernel = make_kernel(graph, (0,), ("y",))
    source = GENERATED_C.source("k", kernel)
    assert f"ko_acc[{channels}];" in source, source
    assert source.count("#pragma GCC unroll 3") == 2  # the 3 x 3 taps written out
    x = np.random.default_rng(2).standard_normal((1, 15, 13, channels)).astype(np.float32)
    x[0, 0, 0, 3] = np.nan  # the first tap of output (0, 0), a padded window
    x[0, 6, 6, 5] = np.nan  # the last tap of output (3, 3) (and the first of (3, 3)'s neighbours)
    x[0, 9, 4, channels - 1] = np.nan  # the last channel
    x[0, 2:5, 2:5, 7] = -np.inf  # a whole window of -inf: its max is -inf
    got = PlanExecutor(graph, [kernel], threads=2)({"x": x})["y"]
    expected = run_reference(graph, {"x": x})["y"]
    assert np.isnan(got[0, 0, 0, 3]) and np.isnan(got[0, 3, 3, 5]) and np.isnan(got[0, 4, 2, channels - 1])
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)
