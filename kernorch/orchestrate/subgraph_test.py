"""Partitioning: contiguous convex ranges within the size limit, cut where the frontier is narrow."""

from __future__ import annotations

import numpy as np

from kernorch.devtools.mutate import here
from kernorch.fission import fission
from kernorch.frontend import import_model
from kernorch.ir.graph import Graph, Node
from kernorch.ir.patterns import attention_spans
from kernorch.ir.types import TensorType
from kernorch.options import OrchestrationLimits
from kernorch.orchestrate.orchestrator import plan_subgraphs
from kernorch.orchestrate.subgraph import cut_widths, partition
from kernorch.tools.demo_models import self_attention_block


def test_partition_covers_graph_within_limits() -> None:
    graph = fission(import_model(self_attention_block()))
    for size in (3, 8, 16, 100):
        ranges = partition(graph, size)
        assert ranges[0][0] == 0 and ranges[-1][1] == len(graph.nodes)
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))
        assert all(0 < end - start <= size for start, end in ranges)


def _diamond_chain(blocks: int) -> Graph:
    """A prologue, then blocks of 5 primitives (three branches joined by two adds) linked by one value."""
    t = TensorType((8,), "float32")
    graph = Graph(inputs=["x"], types={"x": t, "p": t})
    graph.nodes = [Node("relu", ("x",), ("p",))]
    current = "p"
    for b in range(blocks):
        e, n, a, s1, s2 = (f"b{b}_{k}" for k in ("exp", "neg", "abs", "sum1", "sum2"))
        graph.nodes += [
            Node("exp", (current,), (e,)), Node("neg", (current,), (n,)), Node("abs", (current,), (a,)),
            Node("add", (e, n), (s1,)), Node("add", (s1, a), (s2,)),
        ]  # fmt: skip
        graph.types.update({v: t for v in (e, n, a, s1, s2)})
        current = s2
    graph.outputs = [current]
    return graph


def test_partition_cuts_at_the_narrow_frontier() -> None:
    graph = _diamond_chain(4)
    widths = cut_widths(graph)
    assert [widths[i] for i in (1, 6, 11, 16)] == [1, 1, 1, 1]
    assert all(widths[i] >= 2 for i in range(2, 21) if (i - 1) % 5)
    assert [start for start, _ in partition(graph, 5)[1:]] == [1, 6, 11, 16]
    assert [start for start, _ in partition(graph, 6)[1:]] == [6, 11, 16]
    assert [start for start, _ in partition(graph, 11)[1:]] == [11]


def _convolution_chain(blocks: int, chain: int) -> Graph:
    """Blocks of a convolution followed by `chain` elementwise primitives, each block's last value the next one's
    operand: every position between two primitives is crossed by one value."""
    t = TensorType((1, 4, 6, 6), "float32")
    graph = Graph(inputs=["x"], types={"x": t, "w": TensorType((4, 4, 1, 1), "float32")})
    graph.constants = {"w": np.ones((4, 4, 1, 1), np.float32)}
    current = "x"
    for b in range(blocks):
        graph.nodes.append(Node("conv", (current, "w"), (f"b{b}_conv",)))
        current = f"b{b}_conv"
        graph.types[current] = t
        for k in range(chain):
            graph.nodes.append(Node("exp" if k % 2 else "neg", (current,), (f"b{b}_{k}",)))
            current = f"b{b}_{k}"
            graph.types[current] = t
    graph.outputs = [current]
    return graph


def test_partition_cuts_before_a_convolution_not_inside_a_chain() -> None:
    """Every position is one value wide, but only a cut at a convolution's operand keeps no primitives apart that a
    kernel could hold (a library call reads its operand from memory anyway): the partition cuts there."""
    graph = _convolution_chain(blocks=4, chain=5)
    assert set(cut_widths(graph)[1:-1]) == {1}
    starts = [start for start, _ in partition(graph, 8)[1:]]
    assert starts and all(graph.nodes[s].prim == "conv" for s in starts), starts
    assert [s for s, _ in partition(graph, 13)[1:]] == [12]  # two blocks a range: the cut between them


def test_state_cap_splits_subgraphs() -> None:
    graph = fission(import_model(self_attention_block()))
    roomy = plan_subgraphs(graph, OrchestrationLimits(max_subgraph_size=64, max_states=100_000))
    tight = plan_subgraphs(graph, OrchestrationLimits(max_subgraph_size=64, max_states=20))
    assert len(roomy) == 1
    assert len(tight) > 1 and all(states <= 20 for _, states in tight)


def test_partition_keeps_an_attention_in_one_subgraph() -> None:
    """A cut between an attention's two matmuls costs ATTENTION_CUT more (the fused candidate needs them in one
    subgraph): with room for the attention, no range boundary falls inside it, though its cuts are narrow."""
    from kernorch.codegen.native.attention_test import attention_model
    from kernorch.pipeline import import_graph

    graph = import_graph(attention_model(tokens=13, heads=2, head_dim=16, mask="input", nan_guard=True))
    (span,) = attention_spans(graph)
    first, second = span
    assert graph.nodes[first].prim == graph.nodes[second].prim == "matmul"
    widths = cut_widths(graph)
    inside = [widths[p] for p in range(first + 1, second + 1)]
    assert min(inside) <= max(widths[p] for p in range(1, len(graph.nodes)) if not first < p <= second)
    for size in range(second - first + 2, len(graph.nodes)):
        starts = [start for start, _ in partition(graph, size)[1:]]
        assert not [s for s in starts if first < s <= second], (size, starts, span)


def test_an_attention_that_divides_after_its_product_is_not_cut_before_the_division() -> None:
    """softmax(S)·V as matmul(E, V) / l (the rewrites' form): the fused candidate holds the division, so a cut
    between the product and it costs as much as one inside (a cut there left pit_ti's 730-token attention unfused)."""
    from onnx import TensorProto, helper

    from kernorch.orchestrate.subgraph import ATTENTION_CUT, FUSED_CUT, cut_costs, fusable, values_spanning

    shape = [1, 2, 24, 16]
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["s"]),
             helper.make_node("ReduceMax", ["s"], ["m"], axes=[-1], keepdims=1),
             helper.make_node("Sub", ["s", "m"], ["d"]),
             helper.make_node("Exp", ["d"], ["e"]),
             helper.make_node("ReduceSum", ["e", "axis"], ["l"], keepdims=1),
             helper.make_node("MatMul", ["e", "v"], ["o"]),
             helper.make_node("Div", ["o", "l"], ["y"])]  # fmt: skip
    inputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape) for name in ("q", "k", "v")]
    model = helper.make_model(helper.make_graph(
        nodes, "divide-after", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
        [helper.make_tensor("axis", TensorProto.INT64, [1], [-1])]), opset_imports=[helper.make_opsetid("", 17)])
    graph = fission(import_model(model))
    ((first, second),) = attention_spans(graph)
    (division,) = [i for i, node in enumerate(graph.nodes) if node.prim == "div"]
    assert graph.nodes[division].inputs[0] == graph.nodes[second].outputs[0] and division > second
    fused = values_spanning(graph, fusable)
    attention_free = [w + FUSED_CUT * f for w, f in zip(cut_widths(graph), fused, strict=True)]
    costs = cut_costs(graph)
    assert all(costs[p] == attention_free[p] + ATTENTION_CUT for p in range(first + 1, division + 1))
    for size in range(division - first + 1, len(graph.nodes)):
        assert not [s for s, _ in partition(graph, size)[1:] if first < s <= division], size


# The mutants of the code this file tests, each a one-line change a real bug could make and that these tests must
# catch (`make mutate`: kernorch/devtools/mutate.py collects them)
MUTANTS = [
    here("the partition cuts inside elementwise chains as readily as before a library call",
         "FUSED_CUT = 4.0",
         "FUSED_CUT = 0.0"),
    here("the partition takes a convolution's operand for an epilogue it could absorb",
         "return producer.prim in STRIDED_VIEW_PRIMS or producer.prim == \"cast\"",
         "return True or producer.prim in STRIDED_VIEW_PRIMS or producer.prim == \"cast\""),
    here("the partition cuts attentions as freely as anything",
         "ATTENTION_CUT = 8.0",
         "ATTENTION_CUT = 0.0"),
    here("the partition may cut an attention between its product and the division by the row sum",
         "return divisions[0] if len(divisions) == 1 else second",
         "return second"),
]  # fmt: skip
