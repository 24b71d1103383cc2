"""The cost-guided search keeps a rewrite only where the neighbourhood's plan gets cheaper."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kernorch.cost import DEVICE_PRESETS, AnalyticCostModel
from kernorch.cost.model import GeneratableCost
from kernorch.devtools.mutate import here
from kernorch.ir.graph import Graph
from kernorch.orchestrate import orchestrate
from kernorch.rewrite.engine import REWRITE_RULES
from kernorch.rewrite.search import Site, neighbourhood, next_site, rewrite, window_signature
from kernorch.testing.rewrite import assert_equivalent, build, const, emit, prims


def two_layer_softmax_attention(b):  # type: ignore[no-untyped-def]
    outputs = []
    for layer in range(2):
        e = emit(b, "exp", f"s{layer}")
        outputs.append(emit(b, "matmul", emit(b, "div", e, emit(b, "reduce_sum", e, axes=(2,))), "v"))
    return outputs


def counting_cost(prices: dict[str, float]) -> Callable[[Graph], float]:
    """A stand-in for orchestration: each primitive costs its price (1 unless listed)."""
    return lambda graph: sum(prices.get(node.prim, 1.0) for node in graph.nodes)


def test_without_a_cost_model_only_safe_rules_run() -> None:
    graph = build({"s0": (2, 4, 6), "s1": (2, 4, 6), "v": (2, 6, 3)}, two_layer_softmax_attention)
    rewritten, report = rewrite(graph)
    assert "reduce_sum" in prims(rewritten) and not report.trials and not report.cost_guided


def test_a_rewrite_that_makes_the_plan_cheaper_is_kept_and_one_that_does_not_is_rejected() -> None:
    graph = build({"s0": (2, 4, 6), "s1": (2, 4, 6), "v": (2, 6, 3)}, two_layer_softmax_attention)
    cheap_products = counting_cost({"matmul": 0.1, "reduce_sum": 5.0})
    rewritten, report = rewrite(graph, cheap_products)
    assert "reduce_sum" not in prims(rewritten)
    assert any(t.kept and t.rule == "reduce-to-matmul" for t in report.trials)
    assert_equivalent(graph, rewritten)

    dear_products = counting_cost({"matmul": 5.0, "reduce_sum": 0.1})
    rewritten, report = rewrite(graph, dear_products)
    assert prims(rewritten).count("reduce_sum") == 2
    assert report.trials and not any(t.kept for t in report.trials)


def test_identical_neighbourhoods_are_judged_once() -> None:
    graph = build({"s0": (2, 4, 6), "s1": (2, 4, 6), "v": (2, 6, 3)}, two_layer_softmax_attention)
    dear_products = counting_cost({"matmul": 5.0})
    _, report = rewrite(graph, dear_products)
    reduce_trials = [t for t in report.trials if t.rule == "reduce-to-matmul"]
    assert len(reduce_trials) == 2 and [t.reused for t in reduce_trials] == [False, True]


def test_the_time_budget_bounds_the_search_and_says_what_was_left() -> None:
    graph = build({"s0": (2, 4, 6), "s1": (2, 4, 6), "v": (2, 6, 3)}, two_layer_softmax_attention)
    rewritten, report = rewrite(graph, counting_cost({}), budget_seconds=0.0)
    assert not report.trials and report.untried_sites >= 2
    assert "untried (time budget spent)" in report.summary()


def test_every_rule_is_judged_once_before_a_promising_one_is_tried_again() -> None:
    merge, resize = REWRITE_RULES["merge-matmuls"], REWRITE_RULES["pointwise-conv-before-resize"]
    sites = [Site(merge, 3, (3,)), Site(merge, 9, (9,)), Site(resize, 40, (40,))]
    kept_twice = {"merge-matmuls": [True, True]}
    assert next_site(sites, kept_twice).rule is resize  # never judged: first, however late in the graph
    judged = {**kept_twice, "pointwise-conv-before-resize": [False]}
    assert next_site(sites, judged) == sites[0]  # then the rule that pays off, in graph order
    assert next_site(sites, {}) == sites[0]


def test_the_neighbourhood_is_a_graph_of_its_own() -> None:
    rng = np.random.default_rng(0)

    def body(b):  # type: ignore[no-untyped-def]
        y = "x"
        for _ in range(6):
            y = emit(b, "exp", emit(b, "matmul", y, const(b, rng.standard_normal((9, 9)))))
        return y

    graph = build({"x": (3, 9)}, body)
    window = neighbourhood(graph, [5], radius=2)
    assert prims(window) == ["exp", "matmul", "exp", "matmul", "exp"]
    assert len(window.inputs) == 1 and len(window.outputs) == 1 and len(window.constants) == 2
    same_shape = neighbourhood(graph, [7], radius=2)
    assert window_signature(window, graph.nodes[5].outputs[0]) == \
        window_signature(same_shape, graph.nodes[7].outputs[0])  # fmt: skip


def test_with_a_real_cost_model_the_result_is_equivalent_and_verified() -> None:
    graph = build({"s0": (2, 4, 6), "s1": (2, 4, 6), "v": (2, 6, 3)}, two_layer_softmax_attention)
    cost = GeneratableCost(AnalyticCostModel(DEVICE_PRESETS["v100"]))
    rewritten, report = rewrite(graph, lambda g: orchestrate(g, cost).plan.cost)
    assert report.trials and report.nodes_after == len(rewritten.nodes)
    assert_equivalent(graph, rewritten)


# The mutants of the code this file tests, each a one-line change a real bug could make and that these tests must
# catch (`make mutate`: kernorch/devtools/mutate.py collects them)
MUTANTS = [
    here("the rewrite search tries a promising rule again before judging every rule once",
         "key=lambda s: (s.rule.name in outcomes, -_promise(",
         "key=lambda s: (-_promise("),
]  # fmt: skip
