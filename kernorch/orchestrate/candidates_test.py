"""Candidate generation: what a kernel may write."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort

import kernorch
from kernorch.devtools.mutate import here
from kernorch.ir.graph import Graph, Node, verify
from kernorch.ir.primitives import PRIMITIVES, Kind
from kernorch.ir.types import TensorType
from kernorch.options import OrchestrationLimits
from kernorch.orchestrate.candidates import enumerate_candidates
from kernorch.orchestrate.pruning import LinearEpilogues
from kernorch.orchestrate.subgraph import build_subgraphs, scalar_regions
from kernorch.testing import dynamically_quantized_convolution


def test_a_library_call_writes_only_its_final_value() -> None:
    """matmul → add → relu with the sum needed outside too (a graph output, and read by exp): no candidate
    with the matmul writes the sum beside the relu; the rejection says why."""
    t = TensorType((3, 4), "float32")
    graph = Graph(inputs=["x"], types={"x": t, "m": t, "s": t, "r": t, "e": t}, name="mm-add-relu")
    graph.constants = {"w": np.ones((4, 4), np.float32), "b": np.ones((1, 4), np.float32)}
    graph.types.update({"w": TensorType((4, 4), "float32"), "b": TensorType((1, 4), "float32")})
    graph.nodes = [Node("matmul", ("x", "w"), ("m",)), Node("add", ("m", "b"), ("s",)), Node("relu", ("s",), ("r",)),
                   Node("exp", ("s",), ("e",))]  # fmt: skip
    graph.outputs = ["r", "e", "s"]
    verify(graph)
    (sub,) = build_subgraphs(graph, [(0, len(graph.nodes))])
    found = enumerate_candidates(sub, OrchestrationLimits(), LinearEpilogues(graph))
    with_linear = [k for k in found.kernels if any(PRIMITIVES[graph.nodes[i].prim].kind == Kind.LINEAR
                                                     for i in k.nodes)]  # fmt: skip
    assert with_linear, "the matmul must be coverable"
    assert all(len(k.outputs) == 1 for k in with_linear), [(k.nodes, k.outputs) for k in with_linear]
    assert any("exists only inside the library call" in r.reason for r in found.rejected)


def _chain(prims: list[str]) -> Graph:
    """x -> prims[0] -> prims[1] -> ... (unary elementwise steps; "reduce" sums the last axis)."""
    t = TensorType((3, 4), "float32")
    graph = Graph(inputs=["x"], types={"x": t}, name="chain")
    current = "x"
    for i, prim in enumerate(prims):
        value = f"v{i}"
        if prim == "reduce":
            graph.nodes.append(Node("reduce_sum", (current,), (value,), (("axes", (1,)),)))
            graph.types[value] = TensorType((3, 1), "float32")
        else:
            graph.nodes.append(Node(prim, (current,), (value,)))
            graph.types[value] = graph.types[current]
        current = value
    graph.outputs = [current]
    verify(graph)
    return graph


def test_elementwise_chains_may_fill_larger_kernels() -> None:
    """A chain of elementwise primitives only may fill max_elementwise_kernel_size; a set with another kind stops
    at max_kernel_size (a static-QDQ activation is a chain of 32: it fits two kernels, not three)."""
    limits = OrchestrationLimits(max_kernel_size=4, max_elementwise_kernel_size=7)
    for prims, largest in ((["exp", "neg"] * 5, 7), (["exp", "neg", "reduce", "exp", "neg"] * 2, 4)):
        graph = _chain(prims)
        (sub,) = build_subgraphs(graph, [(0, len(graph.nodes))])
        found = enumerate_candidates(sub, limits, LinearEpilogues(graph))
        assert max(len(k.nodes) for k in found.kernels) == largest, prims
    reasons = {r.reason for r in found.rejected if r.rule == "max-size"}
    assert "5 primitives exceed the max kernel size 4 (with a reduce/broadcast primitive)" in reasons
    assert OrchestrationLimits(max_kernel_size=30).elementwise_kernel_size == 30  # never below any kernel's


def _quantizer_scale(tail: bool) -> Graph:
    """x → its min and max (one element each) → the range, the scale, the negated minimum and the zero point (one
    element each: a scalar region) → x / scale + zero point. With `tail`, the sum of that map feeds the region
    again (a scalar added to the scale), which makes the region not convex."""
    big, one = TensorType((1, 4, 3, 3), "float32"), TensorType((1, 1, 1, 1), "float32")
    graph = Graph(inputs=["x"], types={"x": big, "c": TensorType((), "float32")}, name="quantizer-scale")
    graph.constants = {"c": np.asarray(255.0, np.float32)}
    everything = (("axes", (0, 1, 2, 3)),)
    graph.nodes = [Node("reduce_min", ("x",), ("lo",), everything), Node("reduce_max", ("x",), ("hi",), everything),
                   Node("sub", ("hi", "lo"), ("range",)), Node("div", ("range", "c"), ("scale",)),
                   Node("neg", ("lo",), ("nlo",)), Node("div", ("nlo", "scale"), ("zp",)),
                   Node("div", ("x", "scale"), ("q",)), Node("add", ("q", "zp"), ("y",))]  # fmt: skip
    graph.types.update({v: one for v in ("lo", "hi", "range", "scale", "nlo", "zp")})
    graph.types.update({"q": big, "y": big})
    graph.outputs = ["y"]
    if tail:
        graph.nodes += [Node("reduce_sum", ("y",), ("total",), everything), Node("add", ("total", "scale"), ("t",))]
        graph.types.update({"total": one, "t": one})
        graph.outputs.append("t")
    verify(graph)
    return graph


def test_a_scalar_region_is_enumerated_whole() -> None:
    """A quantizer's one-element chain (range, scale, zero point) is a unit: every candidate holds all of it or
    none of it, it counts as one primitive toward the kernel size, and the kernel reducing the map can hold it
    with the map's quantization (eight primitives under a size of five)."""
    graph = _quantizer_scale(tail=False)
    (sub,) = build_subgraphs(graph, [(0, len(graph.nodes))])
    region = {sub.node_ids[i] for i in range(sub.size) if sub.unit_masks[i] != 1 << i}
    assert region == {2, 3, 4, 5}, region
    found = enumerate_candidates(sub, OrchestrationLimits(max_kernel_size=5), LinearEpilogues(graph))
    assert all(region <= set(k.nodes) or not region & set(k.nodes) for k in found.kernels)
    assert any(set(k.nodes) == set(range(8)) for k in found.kernels), "the whole quantizer is one candidate"
    assert not any(set(k.nodes) == {2, 3} for k in found.kernels)


def test_a_region_a_map_feeds_back_into_is_no_unit() -> None:
    """The scale feeds the map whose sum feeds the scalar region again: contracted, it would be a cycle; its nodes
    stay units of their own."""
    graph = _quantizer_scale(tail=True)
    (sub,) = build_subgraphs(graph, [(0, len(graph.nodes))])
    assert scalar_regions(sub) == []
    found = enumerate_candidates(sub, OrchestrationLimits(), LinearEpilogues(graph))
    assert any(set(k.nodes) == {2, 3} for k in found.kernels)


def test_a_dynamic_quantizer_planned_by_regions_matches_onnxruntime() -> None:
    """The plan of a dynamically quantized convolution, its scale chain a unit: the same outputs as onnxruntime's
    on maps with a zero range (a constant map: the scale's guard), negative and odd values."""
    model = dynamically_quantized_convolution()
    compiled = kernorch.compile(model, cost="analytic")
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(12)
    for x in (rng.uniform(-3, 5, (1, 5, 7, 7)), np.full((1, 5, 7, 7), 0.7), rng.normal(0, 9, (1, 5, 7, 7))):
        feeds = {"x": x.astype(np.float32)}
        (expected,) = session.run(None, feeds)
        got = compiled.run(feeds)["y"]
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


# The mutants of the code this file tests, each a one-line change a real bug could make and that these tests must
# catch (`make mutate`: kernorch/devtools/mutate.py collects them)
MUTANTS = [
    here("elementwise chains held to the general kernel size",
         "    if size > limits.elementwise_kernel_size:",
         "    if size > limits.max_kernel_size:", file="kernorch/orchestrate/pruning.py"),
    here("a chain with a reduction may fill an elementwise kernel's size",
         "    if other is None:\n        return None",
         "    if True:\n        return None", file="kernorch/orchestrate/pruning.py"),
    here("library calls may write intermediate values",
         "if linear and (len(mandatory) > 1 or optional):",
         "if False:",
         tests=("kernorch/orchestrate/candidates_test.py",
                "kernorch/runtime/executor_test.py",
                "kernorch/orchestrate/blp_test.py")),
    here("a scalar region's nodes grown one by one",
         "extended = mask | sub.unit_masks[i]",
         "extended = mask | (1 << i)"),
    here("a scalar region that a map feeds back into contracted all the same",
         "if 1 < region.bit_count() <= MAX_SCALAR_REGION and is_convex(sub, region):",
         "if 1 < region.bit_count() <= MAX_SCALAR_REGION:", file="kernorch/orchestrate/subgraph.py"),
    here("a scalar region counted primitive by primitive toward the kernel size",
         "size = (mask & sub.unit_leaders).bit_count()",
         "size = mask.bit_count()", file="kernorch/orchestrate/pruning.py"),
]  # fmt: skip
