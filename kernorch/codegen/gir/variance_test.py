"""A row's mean and variance from one shifted pass: the statistics it computes, one loop over the row fewer
in the C (the GIR's global reads counted before and after), accuracy against float64 where an unshifted one-pass
variance fails, and each case that must stay two passes."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest

import kernorch.codegen.gir.lowering as lower_module
from kernorch.codegen.c.kernel import render_kernel
from kernorch.codegen.gir.graph import GLOBAL, MOVE, Gir
from kernorch.codegen.gir.lowering import ROW_BLOCK, SHORT_ROW_ELEMENTS, lower
from kernorch.codegen.gir.rules import optimize
from kernorch.codegen.gir.variance import one_pass_variance
from kernorch.codegen.loops.description import describe
from kernorch.devtools.mutate import here
from kernorch.ir.builder import PrimitiveBuilder
from kernorch.ir.graph import Graph
from kernorch.ir.kernel import CandidateKernel, make_kernel
from kernorch.ir.types import TensorType
from kernorch.runtime.executor import PlanExecutor
from kernorch.runtime.reference import run_reference


def _layer_norm(shape: tuple[int, ...], residual: bool = False, inverse: float | None = None) -> CandidateKernel:
    """(x - mean) / sqrt(var + eps) over the last axis, x = a (+ b with `residual`); the mean as sum · `inverse`
    (default 1/n)."""
    graph = Graph(inputs=["a", "b"] if residual else ["a"], outputs=[])
    for name in graph.inputs:
        graph.types[name] = TensorType(shape, "float32")
    b = PrimitiveBuilder(graph)
    x = b.emit("add", ["a", "b"])[0] if residual else "a"
    scale = b.constant(np.array(1.0 / shape[-1] if inverse is None else inverse, np.float32))

    def mean(value: str) -> str:
        (total,) = b.emit("reduce_sum", [value], {"axes": (len(shape) - 1,)})
        return b.emit("mul", [total, scale])[0]

    (centred,) = b.emit("sub", [x, mean(x)])
    (variance,) = b.emit("add", [mean(b.emit("mul", [centred, centred])[0]), b.constant(np.array(1e-5, np.float32))])
    (normed,) = b.emit("mul", [centred, b.emit("reciprocal", [b.emit("sqrt", [variance])[0]])[0]])
    graph.outputs = [normed]
    return make_kernel(graph, tuple(range(len(graph.nodes))), (normed,))


def _global_loads(gir: Gir, buffer: str) -> int:
    return sum(op.executions for phase in gir.phases for op in phase.ops if op.kind == MOVE and op.name == "load"
               and gir.slices[op.reads[0]].buffer == buffer and gir.slices[op.reads[0]].level == GLOBAL)  # fmt: skip


def _two_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lower_module, "one_pass_variance", lambda loops, shortest, longest: (loops, False))


def test_the_sum_and_the_squares_come_from_one_shifted_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    loops = describe(_layer_norm((64, 32)))
    rewritten, changed = one_pass_variance(loops, ROW_BLOCK, SHORT_ROW_ELEMENTS)
    assert changed and [p.target for p in rewritten.phases[:5]] == ["acc0k", "acc0s", "acc0q", "acc0", "acc1"]
    shift, shifted, squares, total, variance = (p.expr for p in rewritten.phases[:5])
    assert shift[0] == "load" and "'var'" not in repr(shift[2][2:])  # the row's first element, no loop
    assert shifted[:2] == squares[:2] == ("reduce", "reduce_sum") and "('scalar', 'acc0k')" in repr(squares)
    assert total[1] == "add" and variance[1] == "max"  # S = S' + n·k, V = max(Q - S'²/n, 0)
    assert one_pass_variance(rewritten, ROW_BLOCK, SHORT_ROW_ELEMENTS) == (rewritten, False)
    gir = optimize(lower(loops))
    assert "acc0s in one pass with the next" in gir.describe()
    source = render_kernel("k", loops)
    assert source.count("ko_sum8x8(") == 2 and source.count("for (int64_t ko_k") == 1  # both sums, one loop
    after = _global_loads(gir, loops.inputs[0].name)
    _two_pass(monkeypatch)
    before = _global_loads(optimize(lower(loops)), loops.inputs[0].name)
    # either way the row comes from global memory once (the later passes read it from the thread's cache), plus,
    # in one pass, the shift: one element per row
    blocks = 64 * 32 // 16
    assert (before, after) == (blocks, blocks + 64)


@pytest.mark.parametrize("runtime", ["kernels", "rprogram"])
@pytest.mark.parametrize("shape, residual", [((8, 16, 64), False), ((3, 7, 36), True), ((16, 256), False)])
def test_one_pass_kernels_match_the_reference(runtime: str, shape: tuple[int, ...], residual: bool) -> None:
    """Against float64 numpy for data whose mean is far from 0 and rows whose first element is an outlier
    (the shift furthest from the mean: the most the subtraction can cancel, Samuelson's bound)."""
    kernel = _layer_norm(shape, residual)
    rng = np.random.default_rng(3)
    feeds = {name: (rng.standard_normal(shape) * 0.5 + 300).astype(np.float32) for name in kernel.graph.inputs}
    for value in feeds.values():
        flat = value.reshape(-1, shape[-1])
        flat[::3, 0] += 40  # about sqrt(n) standard deviations of its row away
        flat[1::3] = 7.0  # rows of equal values: variance exactly 0
    x = np.sum([v.astype(np.float64) for v in feeds.values()], axis=0)
    centred = x - x.mean(axis=-1, keepdims=True)
    want = centred / np.sqrt((centred**2).mean(axis=-1, keepdims=True) + 1e-5)
    got = PlanExecutor(kernel.graph, [kernel], runtime=runtime)(feeds)[kernel.outputs[0]]
    # x itself is float32 near 300 (600 with the residual): its last bits alone move the mean by ~1e-5
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-4)
    np.testing.assert_array_equal(got.reshape(-1, shape[-1])[1::3], 0.0)
    reference = run_reference(kernel.graph, feeds)[kernel.outputs[0]]
    np.testing.assert_allclose(got, reference, rtol=1e-4, atol=2e-4)


def test_an_unshifted_one_pass_variance_would_fail_this_accuracy_test() -> None:
    """The test above can fail: Σx² - (Σx)²/n over the same data (float32, as a one-pass kernel without the
    shift would compute it) is off by far more than its tolerance."""
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((64, 64)) * 0.5 + 300).astype(np.float32)
    unshifted = (x * x).sum(axis=1, dtype=np.float32) - x.sum(axis=1, dtype=np.float32) ** 2 / np.float32(64)
    exact = ((x.astype(np.float64) - x.mean(axis=1, keepdims=True, dtype=np.float64)) ** 2).sum(axis=1)
    assert np.abs(unshifted / exact - 1).max() > 0.1


@pytest.mark.parametrize("shape, inverse, why", [
    ((64, 32), 1.0 / 30, "the mean is not S/n"),
    ((64, 512), None, "rows longer than the renderer sums across"),
    ((64, 4), None, "rows shorter than a vector"),
])  # fmt: skip
def test_not_rewritten(shape: tuple[int, ...], inverse: float | None, why: str) -> None:
    loops = describe(_layer_norm(shape, inverse=inverse))
    assert one_pass_variance(loops, ROW_BLOCK, SHORT_ROW_ELEMENTS) == (loops, False), why


def test_not_rewritten_when_the_row_is_read_through_a_merged_variables_part() -> None:
    """The shift substitutes the sum's loop variable by 0; a `part` of it (a merged variable's coordinate)
    would be left behind, reading a variable outside its loop. The two sums' values, compared with the loop
    variable renamed, differ in their parts: left alone."""
    loops = describe(_layer_norm((64, 32)))
    sums = [p.expr[3][0][0] for p in loops.phases if p.scalar and p.expr[0] == "reduce"]

    def parted(tree: Any) -> Any:
        if isinstance(tree, tuple) and tree[:1] == ("var",) and tree[1] in sums:
            return ("part", tree[1], (32,), 0)
        return tuple(parted(child) for child in tree) if isinstance(tree, tuple) else tree

    phases = [replace(p, expr=parted(p.expr)) if p.scalar else p for p in loops.phases]
    changed = replace(loops, phases=phases)
    assert "'part'" in repr(changed.phases[0].expr)
    assert one_pass_variance(changed, ROW_BLOCK, SHORT_ROW_ELEMENTS) == (changed, False)


# The mutants of the code this file tests, each a one-line change a real bug could make and that these tests must
# catch (`make mutate`: kernorch/devtools/mutate.py collects them)
MUTANTS = [
    here("a one-pass variance without its shift",
         '_scalar(shift, substituted(value, {var: ("lit", 0)})),',
         '_scalar(shift, ("const", 0.0, _F32)),'),
    here("the sum of squares in a loop of its own",
         "marked[k] = replace(first, joined=True)",
         "marked[k] = first",
         file="kernorch/codegen/gir/lowering.py"),
]  # fmt: skip
