"""GIR rewrite rules (PowerFusion §5): each returns `(gir, changed)` and never increases global traffic.

- `merge_read_after_read`: two loads of the same slice in one instruction block (and loop body: `scope`) are
  one load, and the same computation on the same registers is one gOperator.
- `raise_thread_local_reads` (synchronization insertion, thread scope): within one parallel iteration a
  thread reads again what it read or wrote before (softmax's and layer norm's passes over a row): no other
  thread is involved, so no device-wide sync is needed and, when the iteration's bytes fit the thread's
  cache, the later passes read at the cache level.
- `raise_scratch_reads` (synchronization insertion across phases): a phase reads scratch an earlier phase
  wrote. When both phases share their parallel loop the same way and read where they wrote, the reader is the
  writer (thread scope) and its share of the scratch, if it fits the thread's cache, is read from there;
  otherwise the read is at the device scope, from global memory.
- `swap_invariant_elementwise`: an elementwise gOperator whose operands are all invariant along the
  innermost loop (broadcast operands), and the load of such an operand, are swapped before the broadcast:
  they run once per iteration of the outer loops, not once per block.

`optimize` applies them to a fixpoint (each rule only ever raises a level, removes a move or lowers an
execution count, so it terminates).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from kernorch.codegen.gir.graph import (
    CACHE,
    CONSTANT,
    ELEMENTWISE,
    GLOBAL,
    MOVE,
    REGISTER,
    SYNC,
    Gir,
    GirPhase,
    GOperator,
)

Rule = Callable[[Gir], tuple[Gir, bool]]
THREAD_CACHE_BYTES = 512 * 1024  # what one thread keeps of its L2 for a kernel's reused data


def merge_read_after_read(gir: Gir) -> tuple[Gir, bool]:
    changed = False
    phases = []
    for phase in gir.phases:
        first: dict[tuple[object, ...], int] = {}  # slice pattern -> register of its first load
        renamed: dict[int, int] = {}
        ops: list[GOperator] = []
        for op in phase.ops:
            op = replace(op, reads=tuple(renamed.get(r, r) for r in op.reads))
            key: tuple[object, ...] | None = None
            if op.kind == MOVE and op.name == "load":
                s = gir.slices[op.reads[0]]
                key = (s.buffer, s.level, s.count, s.width, s.stride, s.index, op.executions, op.scope)
            elif op.kind in (ELEMENTWISE, CONSTANT) and len(op.writes) == 1:  # the same computation, same operands
                key = (op.kind, op.name, op.reads, op.executions, op.code, op.scope)
            if key is not None:
                if key in first:
                    renamed[op.writes[0]] = first[key]
                    changed = True
                    continue
                first[key] = op.writes[0]
            ops.append(op)
        phases.append(replace(phase, ops=tuple(ops)))
    return gir.with_phases(phases), changed


def _raised(gir: Gir, slices: list, op: GOperator, level: str) -> GOperator:
    """The load reading a copy of its slice at `level` (a new slice, as a sync gOperator makes one)."""
    slices.append(replace(gir.slices[op.reads[0]], level=level))
    return replace(op, reads=(len(slices) - 1, *op.reads[1:]))  # (the registers of a gathered index stay)


def raise_thread_local_reads(gir: Gir, cache_bytes: int = THREAD_CACHE_BYTES) -> tuple[Gir, bool]:
    changed = False
    slices = list(gir.slices)
    phases = []
    for phase in gir.phases:
        if not phase.row_bytes:
            phases.append(phase)
            continue
        touched = {gir.slices[s].buffer for op in phase.ops if op.kind == MOVE for s in (*op.reads, *op.writes)
                   if gir.slices[s].level == GLOBAL}  # fmt: skip
        fits = phase.row_bytes * max(len(touched), 1) <= cache_bytes
        seen: set[str] = set()
        ops = []
        for op in phase.ops:
            if op.kind == MOVE:
                side = gir.slices[op.reads[0] if op.name == "load" else op.writes[0]]
                if op.name == "load" and side.level == GLOBAL and side.buffer in seen and fits:
                    op = _raised(gir, slices, op, CACHE)
                    changed = True
                if op.name == "store" or side.stride != 0:  # one element per row (a shift) brings in one line
                    seen.add(side.buffer)
            ops.append(op)
        phases.append(replace(phase, ops=tuple(ops)))
    return gir.with_phases(phases, tuple(slices)), changed


def raise_scratch_reads(gir: Gir, cache_bytes: int = THREAD_CACHE_BYTES) -> tuple[Gir, bool]:
    changed = False
    slices = list(gir.slices)
    written: dict[tuple[str, str], GirPhase] = {}  # (buffer, index) stored by a phase -> that phase
    phases = []
    for phase in gir.phases:
        ops = []
        for op in phase.ops:
            if op.kind == MOVE and op.name == "load":
                s = gir.slices[op.reads[0]]
                writer = written.get((s.buffer, s.index))
                share = gir.buffer_bytes.get(s.buffer, 0) // max(phase.parallel.threads, 1)
                if s.level == GLOBAL and writer is not None and writer is not phase \
                        and _same_owner(writer, phase) and share <= cache_bytes:  # fmt: skip
                    op = _raised(gir, slices, op, CACHE)
                    changed = True
            ops.append(op)
        for op in phase.ops:
            if op.kind == MOVE and op.name == "store":
                s = gir.slices[op.writes[0]]
                written[(s.buffer, s.index)] = phase
        phases.append(replace(phase, ops=tuple(ops)))
    # a device sync before a phase whose every read of earlier phases is now thread-local is not needed
    out = []
    for p, phase in enumerate(phases):
        reads_global = any(op.kind == MOVE and op.name == "load" and slices[op.reads[0]].level == GLOBAL
                           and gir.roles.get(slices[op.reads[0]].buffer) in ("scratch", "output")
                           for op in phase.ops)  # fmt: skip
        if p and not reads_global and any(op.kind == SYNC for op in phase.ops):
            phase = replace(phase, ops=tuple(op for op in phase.ops if op.kind != SYNC))
            changed = True
        out.append(phase)
    return gir.with_phases(out, tuple(slices)), changed


def _same_owner(writer: GirPhase, reader: GirPhase) -> bool:
    """Both phases share the same trip count among the same threads (a static schedule): iteration i, and what
    it writes, belongs to the same thread in both."""
    a, b = writer.parallel, reader.parallel
    return (a.threads, a.iterations) == (b.threads, b.iterations)


def swap_invariant_elementwise(gir: Gir) -> tuple[Gir, bool]:
    changed = False
    phases = []
    for phase in gir.phases:
        invariant = {s for op in phase.ops for s in op.writes if gir.slices[s].level == REGISTER
                     and gir.slices[s].stride == 0 and op.kind in (MOVE, ELEMENTWISE, CONSTANT)}  # fmt: skip
        ops = []
        for op in phase.ops:
            swappable = (op.kind == ELEMENTWISE and op.reads and all(r in invariant for r in op.reads)) or \
                (op.kind == MOVE and op.name == "load" and op.writes[0] in invariant)
            # once per iteration of the outer loops; also where that is not fewer blocks (an innermost loop of
            # one block or less), so the renderer's loop structure is the same in every case
            if swappable and not op.outer and op.outer_executions > 0:
                op = replace(op, executions=min(op.executions, op.outer_executions), outer=True)
                changed = True
            ops.append(op)
        phases.append(replace(phase, ops=tuple(ops)))
    return gir.with_phases(phases), changed


RULES: tuple[Rule, ...] = (merge_read_after_read, raise_thread_local_reads, raise_scratch_reads,
                           swap_invariant_elementwise)  # fmt: skip


def optimize(gir: Gir, rules: tuple[Rule, ...] = RULES) -> Gir:
    """Apply the rules until none changes the GIR (PowerFusion's greedy strategy: all are one-directional)."""
    changed = True
    while changed:
        changed = False
        for rule in rules:
            gir, fired = rule(gir)
            changed |= fired
    return gir
