"""The static memory plan: values alive at the same time never share bytes, and sharing pays."""

from __future__ import annotations

import random

import numpy as np
import pytest

from kernorch.ir.graph import Graph, Node
from kernorch.ir.kernel import make_kernel
from kernorch.ir.types import TensorType
from kernorch.runtime.executor import PlanExecutor
from kernorch.runtime.executor_test import random_graph, random_plan
from kernorch.runtime.memory import ALIGNMENT, allocate, plan_memory
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
        for b, pb in items[i + 1:]:
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
