"""An instance norm's per-channel mean and variance from one shifted pass over the map (variance.py
`one_pass_columns`, joined by the lowering: reductions.py `joined_taps`): the phases it leaves, one pass over the
map fewer (the GIR's global reads counted before and after, and the C's loop nests), accuracy against float64
where the shift matters, and each case that must stay as it was."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest

import kernorch.codegen.gir.lowering as lower_module
from kernorch.codegen.c.kernel import render_kernel
from kernorch.codegen.gir.graph import GLOBAL, MOVE, REDUCE, Gir
from kernorch.codegen.gir.lowering import lower
from kernorch.codegen.gir.reductions import joined_taps
from kernorch.codegen.gir.rules import optimize
from kernorch.codegen.gir.variance import one_pass_columns
from kernorch.codegen.loops.description import describe
from kernorch.devtools.mutate import here
from kernorch.ir.builder import PrimitiveBuilder
from kernorch.ir.graph import Graph
from kernorch.ir.kernel import CandidateKernel, make_kernel
from kernorch.ir.types import TensorType
from kernorch.runtime.executor import PlanExecutor
from kernorch.runtime.reference import run_reference


def _statistics(shape: tuple[int, ...], bias: bool = False, deviations: bool = False) -> CandidateKernel:
    """Per channel of a channels-last map x (+ a per-channel bias): the mean and 1/sqrt(var + eps), as candy's
    instance norms leave them for the kernel applying them; with `deviations` also x - mean (read again)."""
    graph = Graph(inputs=["a", "b"] if bias else ["a"], outputs=[])
    graph.types["a"] = TensorType(shape, "float32")
    if bias:
        graph.types["b"] = TensorType((1, 1, 1, shape[3]), "float32")
    b = PrimitiveBuilder(graph)
    x = b.emit("add", ["a", "b"])[0] if bias else "a"
    inverse = b.constant(np.array(1.0 / (shape[1] * shape[2]), np.float32))

    def mean(value: str) -> str:
        (total,) = b.emit("reduce_sum", [value], {"axes": (1, 2), "keepdims": True})
        return b.emit("mul", [total, inverse])[0]

    average = mean(x)
    (centred,) = b.emit("sub", [x, average])
    (variance,) = b.emit("add", [mean(b.emit("mul", [centred, centred])[0]), b.constant(np.array(1e-5, np.float32))])
    (scale,) = b.emit("reciprocal", [b.emit("sqrt", [variance])[0]])
    graph.outputs = [average, scale, centred] if deviations else [average, scale]
    return make_kernel(graph, tuple(range(len(graph.nodes))), tuple(graph.outputs))


def _global_loads(gir: Gir, buffer: str) -> int:
    return sum(op.executions for phase in gir.phases for op in phase.ops if op.kind == MOVE and op.name == "load"
               and gir.slices[op.reads[0]].buffer == buffer and gir.slices[op.reads[0]].level == GLOBAL)  # fmt: skip


def test_the_mean_and_the_squares_come_from_one_pass_over_the_map(monkeypatch: pytest.MonkeyPatch) -> None:
    loops = describe(_statistics((1, 48, 40, 32)))
    rewritten, changed = one_pass_columns(loops)
    assert changed and len(rewritten.phases) == len(loops.phases) + 2
    shifted, squares, variance, total = (p.expr for p in rewritten.phases[:4])
    assert shifted[:2] == squares[:2] == ("reduce", "reduce_sum") and shifted[3] == squares[3]  # the same taps
    assert "'r" not in repr(shifted[4][4])  # the shift: the channel's value at the centre, no tap variable left
    assert variance[1] == "max" and total[1] == "add"  # V = max(Q - S'²/n, 0), then S = S' + n·k, in place
    total_buffer, squares_buffer = loops.phases[0].target, loops.phases[1].target
    assert [p.target for p in rewritten.phases[:4]] == [total_buffer, squares_buffer, squares_buffer, total_buffer]
    assert one_pass_columns(rewritten) == (rewritten, False)
    gir = optimize(lower(loops))
    joined = [phase for phase in gir.phases if sum(op.kind == REDUCE for op in phase.ops) == 2]
    assert len(joined) == 1 and joined[0].reduction == "split"
    source = render_kernel("k", loops)
    assert source.count("#pragma omp for collapse(2)") == 1 and "ko_parts1[ko_team][32]" in source, source
    map_name = loops.inputs[0].name
    after = _global_loads(gir, map_name)
    monkeypatch.setattr(lower_module, "one_pass_columns", lambda loops: (loops, False))
    two_pass = render_kernel("k", loops)
    assert two_pass.count("#pragma omp for collapse(2)") == 2 and "ko_parts1" not in two_pass
    before = _global_loads(optimize(lower(loops)), map_name)
    blocks = 48 * 40 * 32 // 16
    # one pass over the map instead of two, plus the shift: the channels' centre value, two blocks of 16, moved once in
    # the sums' shared body and once where S = S' + n·k
    assert (before, after) == (2 * blocks, blocks + 2 + 2)


def _outlying(shape: tuple[int, ...], at: tuple[int, int], sigmas: float) -> np.ndarray:
    """A map of mean 300 and standard deviation 0.5 whose value at `at` is `sigmas` deviations out in every
    third channel, and whose channels 1, 4, 7... are constant (variance exactly 0: 1/sqrt(eps))."""
    a = (np.random.default_rng(4).standard_normal(shape) * 0.5 + 300).astype(np.float32)
    a[:, at[0], at[1], ::3] += 0.5 * sigmas
    a[:, :, :, 1::3] = 7.0
    return a


@pytest.mark.parametrize("runtime", ["kernels", "rprogram"])
@pytest.mark.parametrize("shape, bias", [((1, 48, 40, 32), False), ((1, 56, 56, 128), True), ((2, 12, 10, 24), False)])
def test_one_pass_statistics_match_the_reference(runtime: str, shape: tuple[int, ...], bias: bool) -> None:
    """Against float64 numpy, for maps whose mean is far from 0, with a border value far out (a padding's
    effect) and constant channels. Split among threads, shared out by image, and as rTasks."""
    kernel = _statistics(shape, bias)
    assert one_pass_columns(describe(kernel))[1]
    rng = np.random.default_rng(5)
    a = _outlying(shape, (0, 0), 80)
    feeds = {"a": a}
    if bias:
        feeds["b"] = rng.standard_normal((1, 1, 1, shape[3])).astype(np.float32)
    got = PlanExecutor(kernel.graph, [kernel], runtime=runtime)(feeds)
    mean, scale = _exact(feeds)
    np.testing.assert_allclose(got[kernel.outputs[0]], mean, rtol=1e-6)
    np.testing.assert_allclose(got[kernel.outputs[1]], scale, rtol=1e-4)
    np.testing.assert_allclose(got[kernel.outputs[1]][..., 1::3], 1 / np.sqrt(np.float32(1e-5)), rtol=1e-6)
    reference = run_reference(kernel.graph, feeds)
    varying = [c for c in range(shape[3]) if c % 3 != 1]  # the two-pass float32 reference's constant channels
    for name in kernel.outputs:  # get a variance of ~1e-9 from its rounded mean: 1/sqrt(eps) off by 5e-4
        np.testing.assert_allclose(got[name][..., varying], reference[name][..., varying], rtol=1e-4)


def _exact(feeds: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The mean and 1/sqrt(var + eps) per channel, in float64."""
    a, *bias = (value.astype(np.float64) for value in feeds.values())
    x = a + bias[0] if bias else a
    mean = x.mean(axis=(1, 2), keepdims=True)
    return mean, 1 / np.sqrt(((x - mean) ** 2).mean(axis=(1, 2), keepdims=True) + 1e-5)


@pytest.mark.parametrize("sigmas, rtol", [(5, 1e-4), (80, 5e-3)])
def test_the_shift_is_the_centre_value_and_its_worst_case_is_bounded(sigmas: float, rtol: float) -> None:
    """The shift is the value at the centre of the map: far out there (80 standard deviations; the outlier
    itself doubles the variance) the subtraction cancels up to log2(n) bits, and the float32 sums' rounding
    grows with it: within 5e-3, where a shift at the mean would be within 1e-5. 5 deviations out, within 1e-4."""
    shape = (1, 56, 56, 32)
    kernel = _statistics(shape)
    feeds = {"a": _outlying(shape, (28, 28), sigmas)}
    got = PlanExecutor(kernel.graph, [kernel])(feeds)
    mean, scale = _exact(feeds)
    np.testing.assert_allclose(got[kernel.outputs[0]], mean, rtol=1e-6)
    np.testing.assert_allclose(got[kernel.outputs[1]], scale, rtol=rtol)
    if sigmas > 10:  # the bound is not loose: the far outlier costs more than 1e-4
        assert np.abs(got[kernel.outputs[1]][..., ::3] / scale[..., ::3] - 1).max() > 1e-4


def test_not_rewritten_when_the_deviations_are_stored_too() -> None:
    """Storing x - mean reads the map again whatever the statistics do; the variance is teed with it instead."""
    loops = describe(_statistics((1, 48, 40, 32), deviations=True))
    assert one_pass_columns(loops) == (loops, False)
    assert "ko_parts1" not in render_kernel("k", loops)


def test_not_rewritten_when_the_mean_is_not_the_sum_over_n() -> None:
    loops = describe(_statistics((1, 48, 40, 32)))
    wrong = 1.0 / (48 * 40 - 1)
    phases = [replace(p, expr=_rescaled(p.expr, 1.0 / (48 * 40), wrong)) for p in loops.phases]
    changed = replace(loops, phases=phases)
    assert changed != loops and one_pass_columns(changed) == (changed, False)


def _rescaled(tree: Any, old: float, new: float) -> Any:
    if isinstance(tree, tuple) and tree[:1] == ("const",) and np.float32(tree[1]) == np.float32(old):
        return ("const", new, tree[2])
    return tuple(_rescaled(child, old, new) for child in tree) if isinstance(tree, tuple) else tree


def test_sums_over_different_taps_are_not_joined() -> None:
    """Sums over different taps, or one reading what the other stores, each keep a pass of their own."""
    loops = one_pass_columns(describe(_statistics((1, 48, 40, 32))))[0]
    shifted, squares = loops.phases[:2]
    assert joined_taps(shifted, squares, "float32") is not None
    other = replace(squares, expr=(*squares.expr[:3], ((squares.expr[3][0][0], 40), (squares.expr[3][1][0], 48)),
                                   squares.expr[4]))  # fmt: skip
    assert joined_taps(shifted, other, "float32") is None
    reading = replace(squares, expr=(*squares.expr[:4], ("op", "add", "float32", squares.expr[4],
                                                          ("load", shifted.target, ("var", "l3")))))  # fmt: skip
    assert joined_taps(shifted, reading, "float32") is None


# The mutants of the code this file tests, each a one-line change a real bug could make and that these tests must
# catch (`make mutate`: kernorch/devtools/mutate.py collects them)
MUTANTS = [
    here("a column one-pass mean adds the shift n - 1 times",
         '("op", "mul", _F32, shift, ("const", float(n), _F32))',
         '("op", "mul", _F32, shift, ("const", n - 1.0, _F32))',
         file="kernorch/codegen/gir/variance.py"),
    here("sums joined though one reads what the other stores",
         "if first.target in buffers_used(second.expr) or",
         "if False or",
         file="kernorch/codegen/gir/reductions.py"),
]  # fmt: skip
