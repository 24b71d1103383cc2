"""Orchestrator behaviour at its limits: caps are reported and the plan stays valid and ≤ greedy."""

from __future__ import annotations

import pytest

from kernorch.codegen.backends import ONEDNN, choose_backend
from kernorch.codegen.native.attention import BACKEND as FUSED_ATTENTION
from kernorch.codegen.native.panel_matmul import BACKEND as PANEL_MATMUL
from kernorch.cost import DEVICE_PRESETS, AnalyticCostModel
from kernorch.cost.interface import CostModelBase
from kernorch.cost.model import GeneratableCost
from kernorch.fission import fission
from kernorch.frontend import import_model
from kernorch.ir.graph import Graph, Node
from kernorch.ir.kernel import CandidateKernel
from kernorch.ir.types import TensorType
from kernorch.orchestrate import OrchestrationLimits, orchestrate, orchestrator, validate_plan
from kernorch.tools.demo_models import conv_norm_act_block, self_attention_block

COST = GeneratableCost(AnalyticCostModel(DEVICE_PRESETS["a100"]))


def test_candidate_cap_is_reported_and_plan_stays_valid() -> None:
    graph = fission(import_model(self_attention_block()))
    result = orchestrate(graph, COST, OrchestrationLimits(max_candidates=10))
    assert any(s.candidates_capped for s in result.subgraphs)
    assert any(s["candidates_capped"] for s in result.to_json()["subgraphs"])  # and reported as such
    validate_plan(graph, result.plan.kernels)
    assert result.plan.cost <= result.greedy_plan.cost * (1 + 1e-9)


def test_fusion_beats_greedy_and_uses_multi_primitive_kernels() -> None:
    graph = fission(import_model(conv_norm_act_block()))
    result = orchestrate(graph, COST)
    assert result.all_optimal
    assert result.plan.cost < result.greedy_plan.cost
    assert max(len(k.nodes) for k in result.plan.kernels) > 1
    # a reduction and a broadcast consumer of it (back to the full shape) share a kernel: norm fused
    def reduce_then_broadcast(nodes: tuple[int, ...]) -> bool:
        for r in nodes:
            if graph.nodes[r].prim != "reduce_sum":
                continue
            full = graph.types[graph.nodes[r].inputs[0]].shape
            reduced = graph.nodes[r].outputs[0]
            downstream = {reduced}
            for n in nodes:
                if n > r and downstream & set(graph.nodes[n].inputs):
                    downstream.update(graph.nodes[n].outputs)
                    if graph.types[graph.nodes[n].outputs[0]].shape == full:
                        return True
        return False

    assert any(reduce_then_broadcast(k.nodes) for k in result.plan.kernels)


def test_linear_primitives_run_as_library_calls() -> None:
    graph = fission(import_model(self_attention_block()))
    result = orchestrate(graph, COST)
    fused = 0
    for kernel in result.plan.kernels:
        prims = [graph.nodes[n].prim for n in kernel.nodes]
        if prims.count("matmul") == 2:  # an attention: QKᵀ, softmax and ·V as one kernel
            assert choose_backend(kernel)[0] is FUSED_ATTENTION, prims
        elif "matmul" in prims:
            assert choose_backend(kernel)[0] in (ONEDNN, PANEL_MATMUL), prims  # the latter without AVX-512
            fused += len(prims) > 1
    assert fused  # some linear kernel absorbed a transpose, bias or epilogue


def test_an_epilogue_oneDNN_cannot_express_is_never_chosen() -> None:
    """matmul → sin: every candidate with both is costed infinite (not generatable), so sin runs alone."""
    from kernorch.ir.graph import Graph, Node
    from kernorch.ir.types import TensorType

    graph = Graph(inputs=["a"], outputs=["y"], name="sin_epilogue")
    graph.types = {"a": TensorType((4, 8), "float32"), "w": TensorType((8, 8), "float32"),
                   "m": TensorType((4, 8), "float32"), "y": TensorType((4, 8), "float32")}  # fmt: skip
    import numpy as np

    graph.constants = {"w": np.ones((8, 8), np.float32)}
    graph.nodes = [Node("matmul", ("a", "w"), ("m",)), Node("sin", ("m",), ("y",))]
    result = orchestrate(graph, COST)
    assert [tuple(graph.nodes[n].prim for n in k.nodes) for k in result.plan.kernels] == [("matmul",), ("sin",)]
    # and `explain --rejected` can say why the fused candidate was not an option
    (refused,) = [r for r in result.rejected if r.rule == "backend"]
    assert refused.nodes == (0, 1) and "no eltwise algorithm" in refused.reason
    assert result.subgraphs[0].rejected_counts["backend"] == 1


class _Screening(CostModelBase):
    """The analytic cost with a screen that refuses every fusion of three or more primitives."""

    name = "screened"

    def __init__(self) -> None:
        self.priced: list[tuple[int, ...]] = []
        self.screen = lambda kernel: "too big for this test" if len(kernel.nodes) >= 3 else None

    def cost(self, kernel: CandidateKernel) -> float:
        self.priced.append(kernel.nodes)
        return COST.cost(kernel)


def test_a_screened_candidate_is_never_priced_and_is_rejected_with_the_reason() -> None:
    graph = fission(import_model(conv_norm_act_block()))
    screening = _Screening()
    result = orchestrate(graph, screening)
    greedy = {k.nodes for k in result.greedy_plan.kernels}
    assert all(len(nodes) < 3 or nodes in greedy for nodes in screening.priced)  # the greedy plan stays
    assert any(r.rule == "model" and r.reason == "too big for this test" for r in result.rejected)
    assert sum(s.rejected_counts.get("model", 0) for s in result.subgraphs) > 0
    assert all(len(k.nodes) < 3 or k.nodes in greedy for k in result.plan.kernels)
    validate_plan(graph, result.plan.kernels)
    assert result.plan.cost <= result.greedy_plan.cost * (1 + 1e-9)
    unscreened = orchestrate(graph, COST)
    assert unscreened.plan.cost <= result.plan.cost * (1 + 1e-9)  # screening only removes choices


def test_a_subgraph_that_repeats_an_earlier_blp_reuses_its_solution_and_the_plan_is_the_same(
        monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    graph = Graph(inputs=["x"], types={"x": TensorType((64, 64), "float32")})
    value = "x"
    for block in range(4):  # four identical blocks x -> exp -> add(x) -> tanh -> mul(exp): twins after layer 0
        names = [f"b{block}_{i}" for i in range(4)]
        graph.nodes += [Node("exp", (value,), (names[0],)), Node("add", (names[0], value), (names[1],)),
                        Node("tanh", (names[1],), (names[2],)), Node("mul", (names[2], names[0]), (names[3],))]
        graph.types.update({n: graph.types["x"] for n in names})
        value = names[3]
    graph.outputs = [value]
    limits = OrchestrationLimits(max_subgraph_size=4)
    result = orchestrate(graph, COST, limits)
    assert [s.same_as for s in result.subgraphs] == [None, 0, 0, 0]
    assert [s["same_as"] for s in result.to_json()["subgraphs"]] == [None, 0, 0, 0]
    validate_plan(graph, result.plan.kernels)
    monkeypatch.setattr(orchestrator, "instance_key", lambda *_: object())  # every instance solved afresh
    fresh = orchestrate(graph, COST, limits)
    assert all(s.same_as is None for s in fresh.subgraphs)
    assert result.plan.cost == pytest.approx(fresh.plan.cost, rel=1e-12)
    assert result.all_optimal and fresh.all_optimal
