"""lstm-layers-as-waves: stacked LSTM layers become one lstm_stack, equal to the layers it replaces; kept only
where the plan gets cheaper. Where it must not fire: negative_test.py."""

from __future__ import annotations

import onnx

from kernorch.ir.graph import Graph, Node, verify
from kernorch.pipeline import import_graph
from kernorch.rewrite import rewrite
from kernorch.rewrite.engine import REWRITE_RULES, GraphIndex, try_rule
from kernorch.rewrite.search import find_sites, neighbourhood
from kernorch.testing.rewrite import assert_equivalent, prims, rewrite_with
from kernorch.tools.demo_models import stacked_lstm


def _graph(model: onnx.ModelProto) -> Graph:
    graph, _ = rewrite(import_graph(model))  # the safe rules, as the pipeline runs them first
    return graph


def test_layers_join_one_stack() -> None:
    before = _graph(stacked_lstm(3, 16, 5, 2, features=6, state=True))
    after, fired = rewrite_with(before, "lstm-layers-as-waves")
    assert fired == ["lstm-layers-as-waves"] * 2  # layer 1 joins layer 0, then layer 2 the stack
    assert prims(after).count("lstm_stack") == 1 and "lstm_recurrence" not in prims(after)
    # the first layer's projection stays a matmul outside; the others moved into the stack
    assert prims(after).count("matmul") == 1
    assert_equivalent(before, after)


def test_stacks_join() -> None:
    """A stack on top of a stack (the cost-guided search may build pairs first) is one stack."""
    before = _graph(stacked_lstm(4, 16, 6, 1, features=6))
    rule = REWRITE_RULES["lstm-layers-as-waves"]
    graph = before.copy()
    for upper in (3, 1):  # layers 2+3, then 0+1, each alone
        layers = [p for p, n in enumerate(graph.nodes) if n.prim == "lstm_recurrence"]
        assert try_rule(graph, GraphIndex(graph), layers[upper], rule)
    assert prims(graph).count("lstm_stack") == 2
    upper_stack = [p for p, n in enumerate(graph.nodes) if n.prim == "lstm_stack"][1]
    assert try_rule(graph, GraphIndex(graph), upper_stack, rule)
    verify(graph)
    assert prims(graph).count("lstm_stack") == 1 and "lstm_recurrence" not in prims(graph)
    (stack,) = [n for n in graph.nodes if n.prim == "lstm_stack"]
    assert len(stack.attr("unit_blocks")) == 4
    assert_equivalent(before, graph)


def test_judged_with_the_layer_below() -> None:
    """The site's neighbourhood holds both layers, so the local plan before and after can be compared."""
    graph = _graph(stacked_lstm(3, 16, 5, 1, features=6))
    sites = find_sites(graph, [REWRITE_RULES["lstm-layers-as-waves"]])
    assert len(sites) == 2
    window = neighbourhood(graph, sites[0].centres)
    assert prims(window).count("lstm_recurrence") == 2


def test_kept_only_where_cheaper() -> None:
    graph = _graph(stacked_lstm(3, 16, 5, 1, features=6))

    def cheap_stacks(window: Graph) -> float:
        return sum(1.0 if n.prim == "lstm_stack" else 2.0 for n in window.nodes if n.prim.startswith("lstm"))

    def dear_stacks(window: Graph) -> float:
        return sum(9.0 if n.prim == "lstm_stack" else 1.0 for n in window.nodes if n.prim.startswith("lstm"))

    kept, report = rewrite(graph, cheap_stacks)
    assert prims(kept).count("lstm_stack") == 1 and "lstm_recurrence" not in prims(kept)
    assert [t.kept for t in report.trials if t.rule == "lstm-layers-as-waves"][:1] == [True]
    rejected, report = rewrite(graph, dear_stacks)
    assert prims(rejected).count("lstm_recurrence") == 3 and "lstm_stack" not in prims(rejected)
    assert not any(t.kept for t in report.trials)


def test_each_merge_is_judged() -> None:
    """A kept merge does not pull the layers below into the stack unjudged (the rule is no follow-up): with
    pairs cheap and larger stacks dear, four layers become two pairs."""
    graph = _graph(stacked_lstm(4, 16, 5, 1, features=6))

    def pairs_only(window: Graph) -> float:
        def cost(node: Node) -> float:
            return 1.0 if node.prim == "lstm_recurrence" or len(node.attr("unit_blocks")) == 2 else 10.0

        return sum(cost(n) for n in window.nodes if n.prim.startswith("lstm"))

    rewritten, _ = rewrite(graph, pairs_only)
    stacks = [len(n.attr("unit_blocks")) for n in rewritten.nodes if n.prim == "lstm_stack"]
    assert stacks == [2, 2]
