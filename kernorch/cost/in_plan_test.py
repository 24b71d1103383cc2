"""InPlanCost: a kernel measured in place costs the median of what kernels of its signature took there; one
never measured keeps its profile; views stay free."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from kernorch.cost.in_plan import InPlanCost
from kernorch.cost.interface import CostModelBase
from kernorch.ir.graph import Graph, Node
from kernorch.ir.kernel import CandidateKernel, make_kernel
from kernorch.ir.types import TensorType

T = TensorType((4,), "float32")


def _kernels() -> list[CandidateKernel]:
    graph = Graph(inputs=["x"], outputs=["c"], types={"x": T, "a": T, "b": T, "c": T})
    graph.nodes = [Node("exp", ("x",), ("a",)), Node("exp", ("a",), ("b",)), Node("reshape", ("b",), ("c",))]
    return [make_kernel(graph, (i,), graph.nodes[i].outputs) for i in range(3)]


@dataclass
class _Profiles(CostModelBase):
    name: str = "profile"
    has_signatures = True

    def signature_of(self, candidate: CandidateKernel) -> str | None:
        return candidate.primitives[0].prim  # both exps run the same code: one signature

    def cost(self, candidate: CandidateKernel) -> float:
        return 0.0 if candidate.primitives[0].prim == "reshape" else 1e-6


def test_in_plan_times_replace_profiles_by_signature() -> None:
    first, second, view = _kernels()
    model = InPlanCost(_Profiles())
    assert model.cost(first) == pytest.approx(1e-6)  # nothing measured yet: the profile
    model.record([first, second, view], [3e-6, 5e-6, 2e-6])
    assert model.cost(first) == model.cost(second) == pytest.approx(4e-6)  # twins share the median
    assert model.cost(view) == 0.0  # a view runs no code: its launch time is not its cost
    assert "in place" in model.name
    assert model.has_signatures and model.signature_of(first) == "exp"  # the other hooks are the base's
