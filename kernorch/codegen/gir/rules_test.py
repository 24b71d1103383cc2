"""GIR rewrite rules: each checked by the global-memory reads/writes (and blocks) of a kernel before and after."""

from __future__ import annotations

import numpy as np

from kernorch.codegen.gir.graph import (
    CACHE,
    ELEMENTWISE,
    GLOBAL,
    MOVE,
    REGISTER,
    SYNC,
    Gir,
    GirPhase,
    GOperator,
    MemorySlice,
    ParallelUnit,
)
from kernorch.codegen.gir.lowering import lower
from kernorch.codegen.gir.rules import (
    merge_read_after_read,
    optimize,
    raise_scratch_reads,
    raise_thread_local_reads,
    swap_invariant_elementwise,
)
from kernorch.codegen.loops.description import describe
from kernorch.ir.builder import PrimitiveBuilder
from kernorch.ir.graph import Graph
from kernorch.ir.kernel import make_kernel
from kernorch.ir.types import TensorType


def _gir(build: object, inputs: dict[str, tuple[int, ...]]) -> Gir:
    graph = Graph(inputs=list(inputs), outputs=[])
    for name, shape in inputs.items():
        graph.types[name] = TensorType(shape, "float32")
    builder = PrimitiveBuilder(graph)
    outputs = build(builder, *inputs)  # type: ignore[operator]
    graph.outputs = list(outputs)
    kernel = make_kernel(graph, tuple(range(len(graph.nodes))), tuple(outputs))
    return lower(describe(kernel))


def _softmax(b: PrimitiveBuilder, x: str) -> list[str]:
    (m,) = b.emit("reduce_max", [x], {"axes": (1,)})
    (d,) = b.emit("sub", [x, m])
    (e,) = b.emit("exp", [d])
    (s,) = b.emit("reduce_sum", [e], {"axes": (1,)})
    return b.emit("div", [e, s])


def test_a_row_kernel_reads_its_row_from_global_memory_once() -> None:
    gir = _gir(_softmax, {"x": (256, 512)})
    row = 512 * 4
    # lowered: the max pass reads x, exp(x - max) is computed once into the output's row and summed as it is
    # stored, the output pass (dividing in place) reads it back: three passes over a row, two stores
    assert sum(op.name == "exp" for phase in gir.phases for op in phase.ops) == 1
    assert gir.traffic("load") == 3 * 256 * row and gir.traffic("store") == 2 * 256 * row
    raised, changed = raise_thread_local_reads(gir)
    assert changed
    assert raised.traffic("load") == 256 * row, raised.describe()  # only the first pass
    assert raised.traffic("load", CACHE) == 2 * 256 * row
    assert raised.traffic("store") == 2 * 256 * row


def test_a_row_too_large_for_a_thread_cache_stays_global() -> None:
    gir = _gir(_softmax, {"x": (4, 1 << 18)})  # 1 MB rows
    raised, changed = raise_thread_local_reads(gir)
    assert not changed and raised.traffic("load") == gir.traffic("load")


def test_two_reads_of_one_slice_in_a_block_are_one_move() -> None:
    """And computation on the same operands is computed once (the renderer's memo)."""
    def square_plus(b: PrimitiveBuilder, x: str, y: str) -> list[str]:
        (a,) = b.emit("add", [x, y])
        (m,) = b.emit("mul", [x, y])
        return b.emit("add", [a, m])

    gir = _gir(square_plus, {"x": (64, 1024), "y": (64, 1024)})
    bytes_each = 64 * 1024 * 4
    assert gir.traffic("load") == 4 * bytes_each  # x and y loaded for the add and again for the mul
    merged, changed = merge_read_after_read(gir)
    assert changed and merged.traffic("load") == 2 * bytes_each
    # the consumers now read the first load's register: every read slice is still produced by some op
    written = {s for phase in merged.phases for op in phase.ops for s in op.writes}
    read = {s for phase in merged.phases for op in phase.ops for s in op.reads}
    loaded = {s for phase in merged.phases for op in phase.ops for s in op.reads
              if merged.slices[s].level == GLOBAL}  # fmt: skip
    assert read - loaded <= written
    adds = [op for phase in merged.phases for op in phase.ops if op.kind == ELEMENTWISE and op.name == "add"]
    assert len(adds) == 2  # x + y and a + m: different operands


def test_the_same_computation_on_the_same_slice_is_done_once() -> None:
    def twice(b: PrimitiveBuilder, x: str) -> list[str]:
        (t,) = b.emit("transpose", [x], {"perm": (1, 0)})
        (e,) = b.emit("exp", [t])
        (f,) = b.emit("exp", [t])
        return b.emit("add", [e, f])

    gir = _gir(twice, {"x": (256, 512)})
    merged = optimize(gir)
    exps = [op for phase in merged.phases for op in phase.ops if op.kind == ELEMENTWISE and op.name == "exp"]
    assert len(exps) == 1 and merged.traffic("load") * 2 == gir.traffic("load"), merged.describe()


def test_scratch_read_by_its_writer_is_raised_and_the_device_sync_dropped() -> None:
    def pool_then_scale(b: PrimitiveBuilder, x: str) -> list[str]:
        (p,) = b.emit("window_max", [x], {"kernel": (3, 3), "strides": (1, 1), "pads": (1, 1, 1, 1),
                                          "dilations": (1, 1), "ceil_mode": False})  # fmt: skip
        (t,) = b.emit("tanh", [p])
        return b.emit("mul", [p, t])

    gir = _gir(pool_then_scale, {"x": (1, 16, 64, 64)})
    assert len(gir.phases) == 2  # the pooled values in scratch, then the output
    before_global = gir.traffic("load")
    raised, changed = raise_scratch_reads(gir)
    assert changed, gir.describe()
    assert raised.traffic("load") < before_global
    assert not any(op.kind == SYNC for phase in raised.phases for op in phase.ops)


def test_a_scratch_read_through_another_pattern_keeps_the_device_sync() -> None:
    def reduce_then_transpose(b: PrimitiveBuilder, x: str) -> list[str]:
        (s,) = b.emit("reduce_sum", [x], {"axes": (2,)})  # [64, 128, 1]
        (t,) = b.emit("transpose", [s], {"perm": (1, 0, 2)})
        (e,) = b.emit("exp", [t])
        return b.emit("add", [e, e])

    gir = _gir(reduce_then_transpose, {"x": (64, 128, 256)})
    assert len(gir.phases) == 2  # the sums in scratch, then their transpose read across the threads' shares
    raised, _ = raise_scratch_reads(gir)
    assert any(op.kind == SYNC for phase in raised.phases for op in phase.ops), raised.describe()
    assert raised.traffic("load", CACHE) == 0


def test_scratch_read_in_iterations_another_thread_owns_stays_global() -> None:
    """Phase 1 runs twice the iterations of phase 0: its iteration i is not on the thread that wrote element i."""
    slices = (MemorySlice("r0", REGISTER, 1, 16, 1, 4), MemorySlice("scr0", GLOBAL, 1, 16, 1, 4, "iteration"),
              MemorySlice("r1", REGISTER, 1, 16, 1, 4), MemorySlice("out0", GLOBAL, 1, 16, 1, 4, "iteration"))
    write = GirPhase(ParallelUnit(2, 16, 32768), (GOperator(MOVE, "store", (0,), (1,), 2048),))
    read = GirPhase(ParallelUnit(2, 16, 65536), (GOperator(SYNC, "device", (), (), 1),
                                                 GOperator(MOVE, "load", (1,), (2,), 2048),
                                                 GOperator(MOVE, "store", (2,), (3,), 4096)))  # fmt: skip
    gir = Gir(slices, (write, read), {"scr0": 131072, "out0": 262144}, {"scr0": "scratch", "out0": "output"})
    raised, changed = raise_scratch_reads(gir)
    assert not changed and raised.traffic("load") == gir.traffic("load")
    same = gir.with_phases([write, GirPhase(ParallelUnit(2, 16, 32768), read.ops)])
    raised, changed = raise_scratch_reads(same)  # the same trip count: the writer reads it back from its cache
    assert changed and raised.traffic("load") == 0 and raised.traffic("load", CACHE) == gir.traffic("load")


def test_elementwise_work_on_broadcast_operands_runs_once_per_row() -> None:
    def scaled(b: PrimitiveBuilder, x: str, v: str) -> list[str]:
        eps = b.constant(np.full((1, 1), 1e-5, np.float32))
        (a,) = b.emit("add", [v, eps])
        (r,) = b.emit("sqrt", [a])
        return b.emit("div", [x, r])

    gir = _gir(scaled, {"x": (512, 1024), "v": (512, 1)})

    def blocks(g: Gir, name: str) -> int:
        return sum(op.executions for p in g.phases for op in p.ops if op.kind == ELEMENTWISE and op.name == name)

    assert blocks(gir, "sqrt") == 512 * 1024 // 16  # per block of the row, as lowered
    swapped, changed = swap_invariant_elementwise(gir)
    assert changed and blocks(swapped, "sqrt") == 512 and blocks(swapped, "div") == blocks(gir, "div")
    v_buffer = next(b.name for b in gir.buffers if b.shape == (512, 1))
    v_loads = [op.executions for op, s in swapped.moves("load") if s.buffer == v_buffer]
    assert v_loads == [512]  # eps is a literal: no load at all
    # the global bytes of the broadcast operand drop with it; x's do not
    assert swapped.traffic("load") < gir.traffic("load")


def test_optimize_reaches_a_fixpoint_that_never_moves_more() -> None:
    gir = _gir(_softmax, {"x": (128, 256)})
    best = optimize(gir)
    assert best.traffic("load") <= gir.traffic("load") and best.traffic("store") <= gir.traffic("store")
    assert optimize(best).traffic("load") == best.traffic("load")
