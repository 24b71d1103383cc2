"""The GIR performance model: what it charges for, how it ranks, and what its screen leaves out."""

from __future__ import annotations

import math

import numpy as np

from kernorch.codegen.gir.lowering import lower
from kernorch.codegen.gir.rules import optimize
from kernorch.codegen.loops.description import describe
from kernorch.cost.bandwidth import MemoryLevel, MemoryLevels
from kernorch.cost.gir_model import GirScreen, estimate, spearman
from kernorch.ir.builder import PrimitiveBuilder
from kernorch.ir.graph import Graph
from kernorch.ir.kernel import CandidateKernel, make_kernel
from kernorch.ir.types import TensorType

# a machine with round numbers: 200 GB/s in L2 (2 MB), 100 in L3 (32 MB), 20 from DRAM, 1 µs per dispatch
LEVELS = MemoryLevels((MemoryLevel("L2", 2 << 20, 200e9), MemoryLevel("L3", 32 << 20, 100e9),
                       MemoryLevel("DRAM", 1 << 62, 20e9)), 1e-6)  # fmt: skip


def _graph(shape: tuple[int, ...]) -> tuple[Graph, PrimitiveBuilder]:
    graph = Graph(inputs=["x"], outputs=[])
    graph.types["x"] = TensorType(shape, "float32")
    return graph, PrimitiveBuilder(graph)


def _kernel(graph: Graph, outputs: list[str]) -> CandidateKernel:
    graph.outputs = outputs
    return make_kernel(graph, tuple(range(len(graph.nodes))), tuple(outputs))


def _seconds(kernel: CandidateKernel) -> float:
    return estimate(optimize(lower(describe(kernel))), LEVELS, 2)


def test_a_streaming_kernel_costs_its_bytes_at_the_level_it_fits_in() -> None:
    for shape, bandwidth in (((64, 1024), 200e9), ((1024, 2048), 100e9), ((4096, 4096), 20e9)):
        graph, b = _graph(shape)
        (y,) = b.emit("relu", ["x"])
        moved = 2 * 4 * math.prod(shape)
        assert math.isclose(_seconds(_kernel(graph, [y])), moved / bandwidth + 1e-6, rel_tol=1e-9), shape


def _transposed_relu(shape: tuple[int, ...], perm: tuple[int, ...]) -> float:
    graph, b = _graph(shape)
    (t,) = b.emit("transpose", ["x"], {"perm": perm})
    (y,) = b.emit("relu", [t])
    return _seconds(_kernel(graph, [y]))


def test_a_strided_read_costs_a_line_per_element_unless_tiled_or_interleaved() -> None:
    graph, b = _graph((512, 8, 1024))
    (y,) = b.emit("relu", ["x"])
    contiguous = _seconds(_kernel(graph, [y]))
    # [512, 1024, 8]: the innermost loop reads 4 KB apart, 64 bytes per 4-byte element
    assert _transposed_relu((512, 8, 1024), (0, 2, 1)) > 5 * contiguous
    # [8, 1024, 512]: a 1024 x 512 transpose per image, which the renderer tiles
    assert _transposed_relu((8, 512, 1024), (0, 2, 1)) < 1.5 * contiguous
    # [1024, 1024, 4]: 4 planes interleaved, the short innermost loop unrolled and the one outside it vectorized
    assert _transposed_relu((1024, 4, 1024), (0, 2, 1)) < 1.5 * contiguous


def test_transcendental_work_on_a_small_buffer_is_compute_bound() -> None:
    graph, b = _graph((64, 1024))
    value = "x"
    for _ in range(12):
        (value,) = b.emit("tanh", [value])
    heavy = _seconds(_kernel(graph, [value]))
    graph2, b2 = _graph((64, 1024))
    (light,) = b2.emit("relu", ["x"])
    assert heavy > 10 * _seconds(_kernel(graph2, [light]))


def test_spearman_of_orders() -> None:
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == 1.0
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == -1.0
    assert math.isclose(spearman([1, 2, 2, 3], [1, 2, 3, 4]), 0.9486832980505138)
    assert math.isnan(spearman([1.0], [2.0]))


def test_the_screen_leaves_out_a_pooling_that_recomputes_its_producer_per_tap() -> None:
    graph, b = _graph((1, 32, 64, 64))
    value = "x"
    for _ in range(6):
        (value,) = b.emit("tanh", [value])
    window = {"kernel": (5, 5), "strides": (1, 1), "pads": (2, 2, 2, 2), "dilations": (1, 1), "ceil_mode": False}
    (pooled,) = b.emit("window_max", [value], window)
    fused = _kernel(graph, [pooled])
    screen = GirScreen(lambda: LEVELS, 2)
    reason = screen(fused)
    assert reason is not None and "not profiled" in reason
    # the chain alone is a fine fusion, and a single primitive is never screened
    chain = make_kernel(graph, tuple(range(6)), (value,))
    assert screen(chain) is None
    assert screen(make_kernel(graph, (6,), (pooled,))) is None


def test_the_screen_keeps_an_ordinary_elementwise_fusion() -> None:
    graph, b = _graph((128, 1024))
    scale = b.constant(np.full((1, 1024), 0.5, np.float32))
    (a,) = b.emit("mul", ["x", scale])
    (c,) = b.emit("sigmoid", [a])
    (y,) = b.emit("mul", [a, c])
    assert GirScreen(lambda: LEVELS, 2)(_kernel(graph, [y])) is None
