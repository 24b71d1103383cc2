"""Tiled transposes: a transposing copy moves whole tiles as 8 x 8 register blocks (or strips of 8 input rows
when the rows share an L1 set), ragged edges element by element; both against the reference interpreter, in
both runtimes' forms (a kernel, and rTask ranges)."""

from __future__ import annotations

import numpy as np
import pytest

from kernorch.codegen.backends import GENERATED_C
from kernorch.ir.builder import PrimitiveBuilder
from kernorch.ir.graph import Graph
from kernorch.ir.kernel import make_kernel
from kernorch.ir.types import TensorType
from kernorch.runtime.executor import PlanExecutor
from kernorch.runtime.reference import run_reference


def _transpose(shape: tuple[int, ...], perm: tuple[int, ...], then: str | None) -> Graph:
    graph = Graph(inputs=["x"], outputs=[])
    graph.types["x"] = TensorType(shape, "float32")
    builder = PrimitiveBuilder(graph)
    (y,) = builder.emit("transpose", ["x"], {"perm": perm})
    if then is not None:
        (y,) = builder.emit(then, [y])
    graph.outputs = [y]
    return graph


@pytest.mark.parametrize("shape, perm", [((48, 160), (1, 0)), ((37, 150), (1, 0)), ((2, 64, 70, 3), (0, 2, 1, 3)),
                                         ((1, 150, 16384 // 64), (0, 2, 1)), ((3, 40, 33), (0, 2, 1)),
                                         ((2, 64, 512), (0, 2, 1)), ((1, 20, 1024), (0, 2, 1))])  # fmt: skip
def test_a_transposing_copy_moves_register_blocks_and_matches_the_reference(shape: tuple[int, ...],
                                                                           perm: tuple[int, ...]) -> None:  # fmt: skip
    graph = _transpose(shape, perm, None)
    kernel = make_kernel(graph, (0,), tuple(graph.outputs))
    source = GENERATED_C.source("k", kernel)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    want = run_reference(graph, {"x": x})[graph.outputs[0]]
    if perm[-1] == len(shape) - 1:  # the innermost axis stays: no transposed read, no tiles
        assert "ko_transpose8(" not in source
    else:
        assert "ko_transpose8(" in source, source
        # input rows 2 KB or more (a power of two) apart share an L1 set: strips of 8 rows, not square tiles
        strips = shape[-1] * 4 % 2048 == 0
        assert ("_o = 0" in source) != strips and ("_t += 8" in source) == strips, source
    np.testing.assert_array_equal(PlanExecutor(graph, [kernel])({"x": x})[graph.outputs[0]], want)
    for runtime in ("rprogram",):  # rTask ranges of the tiled loop, on both vEUs
        executor = PlanExecutor(graph, [kernel], runtime=runtime)
        executor.build_rprogram({"x": x})
        np.testing.assert_array_equal(executor({"x": x})[graph.outputs[0]], want)


def test_a_transpose_with_computation_is_tiled_element_by_element() -> None:
    graph = _transpose((64, 96), (1, 0), "exp")
    kernel = make_kernel(graph, (0, 1), tuple(graph.outputs))
    source = GENERATED_C.source("k", kernel)
    assert "ko_transpose8(" not in source and "_t += 16" in source
    x = np.random.default_rng(1).standard_normal((64, 96)).astype(np.float32)
    np.testing.assert_allclose(PlanExecutor(graph, [kernel])({"x": x})[graph.outputs[0]],
                               run_reference(graph, {"x": x})[graph.outputs[0]], rtol=2e-7)  # fmt: skip
