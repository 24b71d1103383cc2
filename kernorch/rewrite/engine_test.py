"""The rewrite driver: replacements keep graph outputs, refuse cycles and type changes, reach a fixed point."""

from __future__ import annotations

import numpy as np
import pytest

from kernorch.ir.graph import GraphVerificationError, Node
from kernorch.rewrite.engine import (
    REWRITE_RULES,
    GraphIndex,
    RewriteContext,
    RewriteRule,
    apply_replacement,
    apply_rules,
    topological_order,
)
from kernorch.testing.rewrite import assert_equivalent, build, const, emit, prims, rewrite_with


def test_the_input_graph_is_not_modified() -> None:
    graph = build({"x": (3,)}, lambda b: emit(b, "exp", emit(b, "neg", emit(b, "neg", "x"))))
    nodes, types = list(graph.nodes), dict(graph.types)
    rewrite_with(graph, "neg-neg")
    assert graph.nodes == nodes and graph.types == types


def test_a_graph_output_keeps_its_name_when_a_new_node_computes_it() -> None:
    graph = build({"x": (4, 3)}, lambda b: emit(b, "div", "x", const(b, 2.0)))
    (output,) = graph.outputs
    rewritten, _ = rewrite_with(graph, "div-by-constant")
    assert rewritten.outputs == [output] and prims(rewritten) == ["mul"]
    assert rewritten.nodes[0].outputs == (output,)
    assert_equivalent(graph, rewritten)


def test_a_graph_output_is_not_replaced_by_an_existing_value() -> None:
    """identity(x) as a graph output stays: the output name must keep a producer of its own."""
    graph = build({"x": (3,)}, lambda b: [emit(b, "identity", emit(b, "exp", "x"))])
    rewritten, fired = rewrite_with(graph, "identity")
    assert not fired and prims(rewritten) == ["exp", "identity"]


def test_a_replaced_graph_output_whose_producer_lives_on_is_retired_under_a_new_name() -> None:
    def body(b):  # type: ignore[no-untyped-def]
        first, second = b.emit("split", ["x"], {"axis": 0, "sizes": (2, 4)})
        return [*b.emit("split", [first], {"axis": 0, "sizes": (1, 1)}), second, emit(b, "exp", second)]

    graph = build({"x": (6, 2)}, body)
    rewritten, fired = rewrite_with(graph, "split-split")
    assert fired == ["split-split"] and prims(rewritten) == ["split", "exp"]
    assert_equivalent(graph, rewritten)


def test_a_replacement_that_creates_a_cycle_is_refused() -> None:
    graph = build({"x": (3,)}, lambda b: emit(b, "neg", emit(b, "exp", "x")))
    exp, neg = graph.nodes
    # claim exp's output equals neg(neg's output): neg would read what it produces, through the new node
    new = Node("neg", (neg.outputs[0],), ("cyclic",))
    graph.types["cyclic"] = graph.types[exp.outputs[0]]
    nodes = list(graph.nodes)
    assert not apply_replacement(graph, 0, [new], {exp.outputs[0]: "cyclic"})
    assert graph.nodes == nodes


def test_a_replacement_of_another_type_is_a_bug() -> None:
    graph = build({"x": (3,), "y": (4,)}, lambda b: [emit(b, "exp", "x"), emit(b, "exp", "y")])
    with pytest.raises(GraphVerificationError, match="replaces"):
        apply_replacement(graph, 0, [], {graph.nodes[0].outputs[0]: "y"})


def test_rules_that_undo_each_other_are_stopped() -> None:
    def flip(context: RewriteContext) -> dict[str, str] | None:
        node = context.node
        return {node.outputs[0]: context.emit("mul", node.inputs[1], node.inputs[0])}

    ping = RewriteRule("flip", frozenset({"mul"}), flip, False, "swap a product's operands forever")
    graph = build({"x": (3,), "y": (3,)}, lambda b: emit(b, "mul", "x", "y"))
    with pytest.raises(GraphVerificationError, match="do not converge"):
        apply_rules(graph, [ping])


def test_topological_order_is_stable_and_detects_cycles() -> None:
    a = Node("exp", ("x",), ("a",))
    b = Node("neg", ("a",), ("b",))
    c = Node("exp", ("x",), ("c",))
    assert topological_order([b, c, a], ["x"]) == [c, a, b]
    assert topological_order([a, b, c], ["x"]) == [a, b, c]
    assert topological_order([Node("exp", ("d",), ("e",)), Node("exp", ("e",), ("d",))], ["x"]) is None


def test_a_dry_run_leaves_constants_alone() -> None:
    graph = build({"x": (2, 3)}, lambda b: emit(b, "div", "x", const(b, np.full(3, 4.0))))
    constants = dict(graph.constants)
    context = RewriteContext(graph, GraphIndex(graph), 0, scratch=True)
    assert REWRITE_RULES["div-by-constant"].fn(context)
    assert graph.constants == constants


def test_every_rule_has_a_description_and_a_colocated_test() -> None:
    from pathlib import Path

    tests = "".join(p.read_text() for p in (Path(__file__).parent / "rules").glob("*_test.py"))
    for name, rule in REWRITE_RULES.items():
        assert rule.doc, name
        assert f'"{name}"' in tests, f"rule {name} has no test"


def test_constants_of_a_refused_replacement_are_dropped() -> None:
    """Merging A @ ones with A @ exp(A @ ones) broadcasts the ones into a new constant, then is refused
    (a cycle): that constant must not stay in the graph (it would be saved with the plan)."""

    def body(b):  # type: ignore[no-untyped-def]
        first = emit(b, "matmul", "a", const(b, np.ones((3, 1))))
        return emit(b, "matmul", "a", emit(b, "exp", first))

    graph = build({"a": (2, 3, 3)}, body)
    rewritten, fired = rewrite_with(graph, "merge-matmuls")
    assert not fired and set(rewritten.constants) == set(graph.constants)
