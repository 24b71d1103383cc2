"""The roofline report of a plan's generated kernels: which kernels it lists and the arithmetic of its columns."""

from __future__ import annotations

import numpy as np
import pytest

from kernorch.cost.bandwidth import MemoryLevel, MemoryLevels
from kernorch.cost.gir_model import estimate, kernel_gir
from kernorch.ir.builder import PrimitiveBuilder
from kernorch.ir.graph import Graph
from kernorch.ir.kernel import make_kernel
from kernorch.ir.types import TensorType
from kernorch.runtime.executor import PlanExecutor
from kernorch.tools.kernel_roofline import math_seconds, memory_kernels, summary, table

# kernels timed and per-element costs bounded: alone, not beside the parallel test workers
pytestmark = pytest.mark.serial

LEVELS = MemoryLevels((MemoryLevel("L2", 1 << 20, 100e9), MemoryLevel("L3", 32 << 20, 50e9),
                       MemoryLevel("DRAM", 1 << 62, 10e9)), 1e-6)  # fmt: skip


def test_generated_kernels_slowest_first_with_bytes_at_their_level() -> None:
    graph = Graph(inputs=["x"], outputs=[])
    graph.types["x"] = TensorType((256, 512), "float32")
    b = PrimitiveBuilder(graph)
    w = b.constant(np.random.default_rng(0).standard_normal((512, 64)).astype(np.float32))
    (e,) = b.emit("exp", ["x"])  # kernel 0: generated
    (m,) = b.emit("matmul", [e, w])  # kernel 1: a library call, not listed
    (r,) = b.emit("relu", [m])  # kernel 2: generated, smaller
    graph.outputs = [r]
    kernels = [make_kernel(graph, (i,), graph.nodes[i].outputs) for i in range(3)]
    executor = PlanExecutor(graph, kernels)
    rows = memory_kernels(executor, {"x": np.ones((256, 512), np.float32)}, LEVELS, repeats=3)
    assert sorted(r.kernel for r in rows) == [0, 2]
    assert rows == sorted(rows, key=lambda r: -r.hot_seconds) and all(r.hot_seconds > 0 for r in rows)
    exp_row = next(r for r in rows if r.kernel == 0)
    assert exp_row.bytes_moved == 2 * 256 * 512 * 4 and exp_row.level == "L2"
    assert exp_row.roofline_seconds == exp_row.bytes_moved / 100e9 + 1e-6
    assert exp_row.ratio == exp_row.hot_seconds / exp_row.roofline_seconds  # hot: where the roofline assumes
    assert exp_row.gbs == exp_row.bytes_moved / exp_row.hot_seconds / 1e9
    lines = table(rows, top=1)
    assert len(lines) == 3 and lines[2].startswith(f"| 1 | {rows[0].kernel} |")
    assert summary(rows, over_seconds=0.0, within=1e9).startswith("2 generated kernels")

    # the math floor: a dispatch and the kernel's exp evaluations (one per element) at the given cost; relu: none
    costs = {"exp": 1e-9, "sigmoid": 2e-9, "tanh": 3e-9, "erf": 4e-9}
    rows = memory_kernels(executor, {"x": np.ones((256, 512), np.float32)}, LEVELS, repeats=3, math=costs)
    floors = {r.kernel: r.math_seconds for r in rows}
    assert floors[2] == 0.0 and abs(floors[0] - (1e-6 + 256 * 512 * 1e-9)) < 1e-12
    exp_row = next(r for r in rows if r.kernel == 0)
    assert exp_row.floor_ratio == exp_row.hot_seconds / max(exp_row.roofline_seconds, exp_row.math_seconds)
    assert exp_row.in_plan_ratio == exp_row.seconds / max(exp_row.roofline_seconds, exp_row.math_seconds)
    assert "math floor" in summary(rows) and "in place:" in summary(rows)
    # the GIR model's time of the kernel as generated (here its exp instructions, more than its bytes' time)
    gir = kernel_gir(kernels[0], executor.threads)
    assert gir is not None and exp_row.model_seconds == estimate(gir, LEVELS, executor.threads)
    assert exp_row.model_seconds >= exp_row.roofline_seconds
    assert exp_row.model_ratio == exp_row.hot_seconds / exp_row.model_seconds
    # (the exp kernel's line: rows run slowest first, and a busy moment may make the relu the slower one)
    line = table(rows)[2 + rows.index(exp_row)]
    assert line.endswith(f"| {exp_row.model_seconds * 1e6:.1f} | {exp_row.model_ratio:.2f} |")


def test_math_costs_are_measured_per_element() -> None:
    costs = math_seconds(threads=1, elements=1 << 12)
    assert set(costs) == {"exp", "sigmoid", "tanh", "erf"}
    assert all(0 < seconds < 1e-6 for seconds in costs.values()), costs
