"""`storing`: a plan's own kernels writing some of their intermediate values too (what the rounding arbiter reads
of a checked plan), the same arithmetic, so its outputs unchanged bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from kernorch.devtools.mutate import here
from kernorch.ir.graph import Graph, Node
from kernorch.ir.kernel import make_kernel
from kernorch.ir.plan import Plan, PlanError, storing, validate_plan
from kernorch.ir.types import TensorType
from kernorch.runtime.executor import PlanExecutor
from kernorch.runtime.reference import run_reference

SHAPE = (3, 5)


def _fused() -> Plan:
    """x → exp → tanh → mul(x) as one kernel, then neg as another: t1, t2 and t3 live inside the first."""
    graph = Graph(inputs=["x"], outputs=["y"], name="fused")
    for name in ("x", "t1", "t2", "t3", "y"):
        graph.types[name] = TensorType(SHAPE, "float32")
    graph.nodes = [Node("exp", ("x",), ("t1",)), Node("tanh", ("t1",), ("t2",)), Node("mul", ("t2", "x"), ("t3",)),
                   Node("neg", ("t3",), ("y",))]  # fmt: skip
    kernels = [make_kernel(graph, (0, 1, 2), ("t3",)), make_kernel(graph, (3,), ("y",))]
    return Plan(graph, kernels, [1.0, 1.0])


def test_a_stored_value_is_written_by_the_kernel_computing_it() -> None:
    plan = _fused()
    stored = storing(plan, ["t1", "y"])
    assert [k.nodes for k in stored.kernels] == [k.nodes for k in plan.kernels]
    assert [k.outputs for k in stored.kernels] == [("t3", "t1"), ("y",)]
    assert stored.graph.outputs == ["y", "t1"] and plan.graph.outputs == ["y"]  # the plan itself is untouched
    validate_plan(stored.graph, stored.kernels)
    x = np.random.default_rng(0).normal(0, 1, SHAPE).astype(np.float32)
    got = PlanExecutor(stored.graph, stored.kernels)({"x": x})
    alone = PlanExecutor(plan.graph, plan.kernels)({"x": x})
    np.testing.assert_array_equal(got["y"], alone["y"])
    reference = run_reference(stored.graph, {"x": x})
    np.testing.assert_allclose(got["t1"], reference["t1"], rtol=1e-6)


def test_a_value_no_kernel_computes_is_refused() -> None:
    with pytest.raises(PlanError, match="computes"):
        storing(_fused(), ["nowhere"])


MUTANTS = [
    here("a stored value is made a graph output but no kernel writes it",
         "kernels.append(replace(kernel, outputs=kernel.outputs + extra, graph=graph))",
         "kernels.append(replace(kernel, graph=graph))", file="kernorch/ir/plan.py"),
]  # fmt: skip
