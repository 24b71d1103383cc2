"""A map phase stored by the interchanged reduction that computes its values: one pass over the map fewer (the
GIR's global reads of it counted before and after), the same numbers as the reference, and each case that
must not fuse left alone."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

import kernorch.codegen.gir.lowering as lower_module
from kernorch.codegen.c.kernel import render_kernel
from kernorch.codegen.gir.graph import GLOBAL, MOVE, Gir
from kernorch.codegen.gir.lowering import lower
from kernorch.codegen.gir.rules import optimize
from kernorch.codegen.gir.tee import tee_maps_into_reductions
from kernorch.codegen.loops.description import describe
from kernorch.devtools.mutate import here
from kernorch.ir.builder import PrimitiveBuilder
from kernorch.ir.graph import Graph
from kernorch.ir.kernel import CandidateKernel, make_kernel
from kernorch.ir.types import TensorType
from kernorch.runtime.executor import PlanExecutor
from kernorch.runtime.reference import run_reference

SHAPE = (1, 48, 40, 32)  # channels-last: the statistics are per channel, over the 48 x 40 positions


def _instance_norm_parts(outputs: Callable[[PrimitiveBuilder, str, str, str], list[str]]) -> CandidateKernel:
    """mean and variance over axes 1, 2 (two sums), the deviations x - mean; `outputs` picks the outputs."""
    graph = Graph(inputs=["x"], outputs=[])
    graph.types["x"] = TensorType(SHAPE, "float32")
    b = PrimitiveBuilder(graph)
    inverse = b.constant(np.array(1.0 / (SHAPE[1] * SHAPE[2]), np.float32))
    (total,) = b.emit("reduce_sum", ["x"], {"axes": (1, 2), "keepdims": True})
    (mean,) = b.emit("mul", [total, inverse])
    (centred,) = b.emit("sub", ["x", mean])
    (square,) = b.emit("mul", [centred, centred])
    (squares,) = b.emit("reduce_sum", [square], {"axes": (1, 2), "keepdims": True})
    (variance,) = b.emit("mul", [squares, inverse])
    graph.outputs = outputs(b, centred, variance, mean)
    return make_kernel(graph, tuple(range(len(graph.nodes))), tuple(graph.outputs))


def _global_loads(gir: Gir, buffer: str) -> int:
    """Blocks loaded from `buffer` in global memory, over all phases (a pass over it: its size / 16)."""
    return sum(op.executions for phase in gir.phases for op in phase.ops if op.kind == MOVE and op.name == "load"
               and gir.slices[op.reads[0]].buffer == buffer and gir.slices[op.reads[0]].level == GLOBAL)  # fmt: skip


def test_the_deviations_are_stored_by_the_variance_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    kernel = _instance_norm_parts(lambda b, centred, variance, mean: [variance, centred])
    loops = describe(kernel)
    teed = tee_maps_into_reductions(loops)
    assert len(teed.phases) == len(loops.phases) - 1
    assert "'tee'" in repr(teed.phases[1].expr) and teed.phases[1].target == loops.phases[1].target
    x = loops.inputs[0].name
    after = _global_loads(optimize(lower(loops)), x)
    monkeypatch.setattr(lower_module, "tee_maps_into_reductions", lambda loops: loops)
    before = _global_loads(optimize(lower(loops)), x)
    blocks = int(np.prod(SHAPE)) // 16
    assert (before, after) == (3 * blocks, 2 * blocks)  # mean, variance, deviations -> mean, variance


@pytest.mark.parametrize("runtime", ["kernels", "rprogram"])
def test_teed_kernels_match_the_untouched_kernel_and_the_reference(
    runtime: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    kernel = _instance_norm_parts(lambda b, centred, variance, mean: [variance, centred])
    source = render_kernel("k", describe(kernel))
    assert source.count("for (int64_t r") == 4  # two sums over the positions, no third pass
    x = (np.random.default_rng(0).standard_normal(SHAPE) * 3 + 5).astype(np.float32)
    got = PlanExecutor(kernel.graph, [kernel], runtime=runtime)({"x": x})
    monkeypatch.setattr(lower_module, "tee_maps_into_reductions", lambda loops: loops)
    untouched = PlanExecutor(kernel.graph, [kernel], runtime=runtime)({"x": x})
    want = run_reference(kernel.graph, {"x": x})
    for name in kernel.outputs:  # the same operations in the same order (GCC may contract a product and sum
        # into an FMA in one and not the other: an ulp)
        np.testing.assert_allclose(got[name], untouched[name], rtol=5e-7, atol=0, err_msg=name)
        # float32 sums of 1920 values near 5: the mean, so the deviations, within ~1e-5 of float64's
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-4, err_msg=name)


def test_a_map_reading_the_reductions_result_is_not_teed() -> None:
    """x - variance needs the variance: it runs after the sum, not inside it."""

    def outputs(b: PrimitiveBuilder, centred: str, variance: str, mean: str) -> list[str]:
        return [variance, b.emit("sub", [centred, variance])[0]]

    loops = describe(_instance_norm_parts(outputs))
    assert tee_maps_into_reductions(loops).phases == loops.phases


def test_a_map_over_part_of_the_domain_is_not_teed() -> None:
    """The deviations of half the positions: stored from the variance's taps, the others would be missed or
    written twice, so the phase stays."""

    def outputs(b: PrimitiveBuilder, centred: str, variance: str, mean: str) -> list[str]:
        (half,) = b.emit("slice", [centred], {"ranges": ((0, 1, 1), (0, 24, 1), (0, 40, 1), (0, 32, 1))})
        return [variance, half]

    loops = describe(_instance_norm_parts(outputs))
    assert tee_maps_into_reductions(loops).phases == loops.phases


# The mutants of the code this file tests, each a one-line change a real bug could make and that these tests must
# catch (`make mutate`: kernorch/devtools/mutate.py collects them)
MUTANTS = [
    here("a map over part of a reduction's domain is teed into it",
         "        if not _one_to_one(mapped, binding, sizes):\n            continue",
         "        if False:\n            continue"),
    here("a teed value is not stored",
         "            self.store_at(tree[1], tree[2], result, ctx)\n",
         "",
         file="kernorch/codegen/gir/lowering.py"),
]  # fmt: skip
