"""Row kernels keep an expensive value that is both reduced and output in the row of an output buffer: computed
once per element, checked in the C and against the reference interpreter."""

from __future__ import annotations

import numpy as np
import pytest

from kernorch.codegen.backends import GENERATED_C
from kernorch.codegen.loops.rows import kept_in_row
from kernorch.ir.builder import PrimitiveBuilder
from kernorch.ir.graph import Graph
from kernorch.ir.kernel import make_kernel
from kernorch.ir.types import TensorType
from kernorch.runtime.executor import PlanExecutor
from kernorch.runtime.reference import run_reference

SHAPE = (5, 37, 203)


def _graph(build: object) -> Graph:
    graph = Graph(inputs=["x"], outputs=[])
    graph.types["x"] = TensorType(SHAPE, "float32")
    graph.outputs = list(build(PrimitiveBuilder(graph)))  # type: ignore[operator]
    return graph


def _softmax_parts(b: PrimitiveBuilder) -> tuple[str, str]:
    (m,) = b.emit("reduce_max", ["x"], {"axes": (2,)})
    (d,) = b.emit("sub", ["x", m])
    (e,) = b.emit("exp", [d])
    (s,) = b.emit("reduce_sum", [e], {"axes": (2,)})
    return e, s


def _check(graph: Graph, atol: float = 1e-7) -> str:
    kernel = make_kernel(graph, tuple(range(len(graph.nodes))), tuple(graph.outputs))
    x = np.random.default_rng(0).standard_normal(SHAPE).astype(np.float32) * 4
    got = PlanExecutor(graph, [kernel])({"x": x})
    want = run_reference(graph, {"x": x})
    for name in graph.outputs:
        np.testing.assert_allclose(got[name], want[name], rtol=2e-6, atol=atol, err_msg=name)
    return GENERATED_C.source("k", kernel)


def test_softmax_computes_exp_once_per_element() -> None:
    def softmax(b: PrimitiveBuilder) -> list[str]:
        e, s = _softmax_parts(b)
        return b.emit("div", [e, s])

    source = _check(_graph(softmax))
    assert source.count("ko_expf(") == 1, source


@pytest.mark.parametrize("order", ["scaled first", "softmax first"])
def test_another_output_reads_the_kept_value_before_it_is_overwritten(order: str) -> None:
    def two(b: PrimitiveBuilder) -> list[str]:
        e, s = _softmax_parts(b)
        (y,) = b.emit("div", [e, s])
        (w,) = b.emit("mul", [e, b.constant(np.array(0.5, np.float32))])
        return [w, y] if order == "scaled first" else [y, w]

    assert _check(_graph(two)).count("ko_expf(") == 1


def test_the_kept_value_may_be_an_output_itself() -> None:
    def both(b: PrimitiveBuilder) -> list[str]:
        e, s = _softmax_parts(b)
        (y,) = b.emit("div", [e, s])
        return [e, y]

    assert _check(_graph(both)).count("ko_expf(") == 1


def test_a_cheap_value_is_computed_again_rather_than_kept() -> None:
    def centered_square_mean(b: PrimitiveBuilder) -> list[str]:
        (m,) = b.emit("reduce_sum", ["x"], {"axes": (2,)})
        (d,) = b.emit("sub", ["x", m])
        (q,) = b.emit("mul", [d, d])
        (v,) = b.emit("reduce_sum", [q], {"axes": (2,)})
        return b.emit("div", [q, v])

    graph = _graph(centered_square_mean)
    nodes = graph.nodes
    reductions = [n for n in nodes if n.prim.startswith("reduce_")]
    assert kept_in_row(graph, nodes, reductions, tuple(graph.outputs), SHAPE) is None
    _check(graph, atol=1e-6)  # sums of squares of values near 60 summed in another order: float32 rounding
