"""GIR (PowerFusion §4): a memory-intensive kernel as a dataflow graph whose data movement is explicit.

Nodes are *gOperators*: computation (elementwise, reduce, broadcast) and data movement (`move`: a load from
or a store to a memory slice at some level; `sync`: the point after which a slice written by some parallel
units may be read by others, with a scope). Edges are *memory slices*: `count` segments of `width`
contiguous elements, `stride` elements apart, at one memory level. A slice here is what one instruction block
touches: one iteration of the kernel's innermost loop with its vector lanes (`lanes` elements at once).

Levels on this CPU, slowest first: `global` (a buffer in DRAM or the shared L3: which of the two is the
performance model's call, from the buffer's size), `cache` (data a thread reuses from its own L1/L2),
`register` (vector registers). The parallel unit is a thread; `lanes` is the vector width within it.

A `GirPhase` is one parallel loop of the kernel (kernels with scratch have several, separated by device-wide
syncs). `executions` of a gOperator is how many times its instruction block runs per kernel call.

What a renderer needs beside the graph (PowerFusion §7: the parallel structure first, then the gOperators in
order): each gOperator's `code` (a move's index expression, an elementwise primitive's operand dtype, a
constant's value), each phase's loops and how its parallel unit maps onto them (`mode`), the kernel's buffers
and tables. `c/render.py` renders C from that alone.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import NamedTuple, TypeVar

import numpy as np

from kernorch.codegen.loops import Buffer, Tree

GLOBAL, CACHE, REGISTER = "global", "cache", "register"
LINE_BYTES = 64
STRIP_ROWS = 8  # input rows a strip of a transposing copy moves at once (8 x 8 register blocks)

# gOperator kinds (a constant is a register initialised once: no instruction block of its own)
MOVE, SYNC, ELEMENTWISE, REDUCE, BROADCAST, CONSTANT = "move", "sync", "elementwise", "reduce", "broadcast", "constant"
# how a phase's loops map onto its parallel unit: threads share the loops outside the innermost one, or the
# innermost loop itself (too few iterations outside it), or one thread runs them all
OUTER, INNERMOST, SERIAL = "outer", "innermost", "serial"


@dataclass(frozen=True)
class MemorySlice:
    buffer: str  # kernel buffer (input, output, scratch, table) or a register name
    level: str  # GLOBAL, CACHE or REGISTER
    count: int  # segments
    width: int  # contiguous elements per segment
    stride: int  # elements between segment starts; -1: irregular (a gather through computed indices)
    itemsize: int
    index: str = ""  # which elements (the simplified index tree, printed): equal slices hold the same data

    @property
    def elements(self) -> int:
        return self.count * self.width

    @property
    def line_bytes(self) -> int:
        """Bytes of cache lines the block touches: a segment shorter than a line still moves whole lines,
        and segments closer than a line share them."""
        if self.level == REGISTER:
            return 0
        segment = self.width * self.itemsize
        if self.count == 1:
            return segment
        if 0 <= self.stride * self.itemsize < LINE_BYTES:
            return max(((self.count - 1) * self.stride + self.width) * self.itemsize, segment)
        return self.count * max(-(-segment // LINE_BYTES) * LINE_BYTES, LINE_BYTES)


class Constant(NamedTuple):
    """A constant gOperator's value (a register initialised once)."""

    value: float | int | bool
    dtype: str


class Select(NamedTuple):
    """A select on indices (a pad's border, a concat's pieces): the condition's index tree and the scopes of
    its two branches, each evaluated only where its indices are valid."""

    condition: Tree
    then: int
    otherwise: int


class Reduction(NamedTuple):
    """A reduction's element type, its tap loops (variable, size), the guard its taps are read under (None:
    all are valid), the scopes of its body and of the guard's values, and whether its taps are shared out among
    the phase's threads (`reductions.shared_extrema`)."""

    dtype: str
    loops: tuple[tuple[str, int], ...]
    guard: Tree | None
    body: int
    guard_scope: int
    shared: bool = False


_Code = TypeVar("_Code")

# What a renderer needs of a gOperator beyond its kind and name: a move's index tree, an elementwise operation's
# operand dtype (None: a select on values), a constant's value, a row statistic's name (a "slot" constant), a
# guarded select's branches, a reduction's loops
OpCode = Tree | str | Constant | Select | Reduction | None


@dataclass(frozen=True)
class GOperator:
    kind: str  # MOVE, SYNC, ELEMENTWISE, REDUCE, BROADCAST
    name: str  # the primitive (elementwise/reduce), "load"/"store" (move), the scope (sync)
    reads: tuple[int, ...]  # slice ids
    writes: tuple[int, ...]
    executions: int  # instruction blocks per kernel call
    work: int = 1  # element operations per block and lane
    outer_executions: int = 0  # blocks if it ran once per iteration of the loops outside the innermost (0: n/a)
    code: OpCode = None
    scope: tuple[int, ...] = ()  # the nest of loop bodies it runs in (row steps, reductions): () the phase's
    outer: bool = False  # runs once per iteration of the loops outside the innermost (swapped before the broadcast)

    # the code, read as what this gOperator's kind holds (a wrong kind is a bug: it raises)
    @property
    def index(self) -> Tree:
        """A move's element index."""
        return _as(self.code, tuple, self, "an index")

    @property
    def dtype(self) -> str | None:
        """An elementwise operation's operand dtype (None: a select on values)."""
        return None if self.code is None else _as(self.code, str, self, "a dtype")

    @property
    def constant(self) -> Constant:
        return _as(self.code, Constant, self, "a constant")

    @property
    def slot(self) -> str:
        """The row statistic a "slot" constant reads."""
        return _as(self.code, str, self, "a slot")

    @property
    def select(self) -> Select:
        return _as(self.code, Select, self, "a select")

    @property
    def reduction(self) -> Reduction:
        return _as(self.code, Reduction, self, "a reduction")


def _as(code: OpCode, kind: type[_Code], op: GOperator, what: str) -> _Code:
    if not isinstance(code, kind) or kind is tuple and isinstance(code, (Constant, Select, Reduction)):
        raise TypeError(f"{op.kind} {op.name} holds {type(code).__name__}, not {what}")
    return code


@dataclass(frozen=True)
class ParallelUnit:
    threads: int  # threads sharing the phase's parallel loop (1: a serial phase)
    lanes: int  # vector lanes per instruction block (1: scalar)
    iterations: int  # trip count of the parallel loop
    mode: str = SERIAL  # OUTER, INNERMOST or SERIAL


@dataclass(frozen=True)
class RowStep:
    """One step of a row-schedule phase, per row: a reduction into a row statistic (`slot`), or loops over the
    row's elements (`loops`) storing an output, or one store per row (neither); or loops storing an output
    and summing what they store into a row statistic (`summed`)."""

    scope: tuple[int, ...]  # the scope of its gOperators
    loops: tuple[tuple[str, int], ...]
    slot: str  # the row statistic it defines ("": it stores)
    result: int  # the register holding its value
    summed: bool = False  # loops that store `result` and sum it into `slot` (the sum step after it, fused)
    # a float sum over the row kept as one vector of lane partials per row, the partials of a block of rows
    # summed together (`GirPhase.row_block`), and the work after the sum run across those rows at once
    across: bool = False
    # a sum across the block's rows whose loop also computes the next step's (over as many elements, not
    # reading this one's value): one pass over the row for both (a shifted mean and variance, variance.py)
    joined: bool = False
    # a loop step whose row length is not a multiple of the vector width ends with one more vector block of
    # this many elements that overlaps the block before it (0: a scalar remainder): the step only maps what it
    # reads to what it stores and reads nothing it stores, so the overlapped elements are rewritten with the
    # values they already hold
    overlapped_tail: int = 0
    # a loop step over one loop that only maps and reads nothing it stores: its iterations are independent
    independent: bool = False


def bare_sum(step: RowStep, ops: Sequence[GOperator]) -> bool:
    """Whether a row statistic's value is its sum itself: only constants after the sum in its own scope."""
    own = [op for op in ops if op.scope == step.scope]
    at = next(position for position, op in enumerate(own) if op.kind == REDUCE)
    return step.result == own[at].writes[0] and all(op.kind == CONSTANT for op in own[at + 1 :])


@dataclass(frozen=True)
class GirPhase:
    parallel: ParallelUnit
    ops: tuple[GOperator, ...]
    row_bytes: int = 0  # bytes one parallel iteration touches (what a thread keeps in its cache between passes)
    loops: tuple[tuple[str, int], ...] = ()  # (variable, trip count), outermost first
    # the innermost loop's variable when that loop is a few iterations, unrolled, and the one around it is
    # the vector loop (an NCHW -> NHWC transpose of 3 channels); "": the innermost loop is the vector loop
    unrolled: str = ""
    steps: tuple[RowStep, ...] = ()  # a row-schedule phase: `loops` are the rows, these run per row
    row_block: int = 0  # a row-schedule phase run in blocks of this many rows, each step over the block's rows
    # a phase storing a reduction along its innermost axis with the taps outside that axis: "interchanged",
    # or "split" when the taps are also shared out among the threads kernel by kernel (reductions.py)
    reduction: str = ""
    # a phase reading its input transposed (tiling.py): "elements" (tiles element by element),
    # "blocks" (a float copy: tiles moved as 8 x 8 register blocks), "strips" (a float copy whose input rows
    # share an L1 set: 8 input rows at a time, whole); "": not tiled
    tiled: str = ""
    strides: tuple[int, int] = (0, 0)  # a tiled copy's input stride along the innermost loop, output stride along
    # the one outside it
    # the innermost loop cut into ranges where its selects change (splitting.py): (begin, end, the scope of
    # that range's gOperators); (): one loop
    pieces: tuple[tuple[int, int, tuple[int, ...]], ...] = ()
    # an upsampling along the innermost axis (its last two loops q and residue r) run by vector blocks of 16
    # output positions, each input row it reads held in registers and permuted (row_permute.py)
    row_permuted: bool = False

    def task_units(self, tile: int) -> int:
        """The iterations of the loop an rTask takes a share of (Rammer's units of work, for the scheduler): the
        loops the phase's threads share (`parallel.mode`) as its structure lays them out — its rows (in blocks of
        `row_block`), the loops around an interchanged reduction, around an unrolled short loop or permuted rows,
        a transpose's tiles (`tile` a side) or strips (STRIP_ROWS input rows each); the innermost loop when it
        alone is shared; 1 for a serial phase."""
        mode, loops = self.parallel.mode, self.loops
        if mode == SERIAL or not loops:
            return 1
        if self.steps:  # shared rows (OUTER)
            rows = math.prod(size for _, size in loops)
            return -(-rows // self.row_block) if self.row_block else rows
        if self.tiled:  # shared tiles (OUTER)
            *outer, (_, size_a), (_, size_b) = loops
            around = math.prod(size for _, size in outer)
            if self.tiled == "strips":
                return around * -(-size_b // STRIP_ROWS)
            return around * -(-size_a // tile) * -(-size_b // tile)
        # the loops inside the shared ones: the output's innermost (an interchanged reduction's taps run inside
        # it), or the vector loop with an unrolled short loop or permuted row residues inside it
        inner = -2 if self.unrolled or self.row_permuted else -1
        if mode == INNERMOST:  # (a reduction's or permuted rows' phase shares only its outer loops)
            return 1 if self.reduction or self.row_permuted else loops[inner][1]
        return math.prod(size for _, size in loops[:inner])


@dataclass(frozen=True)
class Gir:
    slices: tuple[MemorySlice, ...]
    phases: tuple[GirPhase, ...]
    buffer_bytes: dict[str, int]  # global buffers: whole size
    roles: dict[str, str]  # buffer -> input, output, scratch, table
    buffers: tuple[Buffer, ...] = ()  # the kernel's arguments: inputs, outputs, scratch
    tables: dict[str, np.ndarray] = field(default_factory=dict)  # constant lookup tables (resize)

    def task_units(self, tile: int) -> tuple[int, ...]:
        """Per phase, the iterations its rTasks share out (`GirPhase.task_units`)."""
        return tuple(phase.task_units(tile) for phase in self.phases)

    def with_phases(self, phases: list[GirPhase], slices: tuple[MemorySlice, ...] | None = None) -> Gir:
        return replace(self, phases=tuple(phases), slices=self.slices if slices is None else slices)

    def moves(self, direction: str, level: str = GLOBAL) -> list[tuple[GOperator, MemorySlice]]:
        """(move, its global-side slice) for every load ("load") or store ("store") at `level`."""
        found = []
        for phase in self.phases:
            for op in phase.ops:
                if op.kind == MOVE and op.name == direction:
                    side = self.slices[op.reads[0] if direction == "load" else op.writes[0]]
                    if side.level == level:
                        found.append((op, side))
        return found

    def traffic(self, direction: str, level: str = GLOBAL) -> int:
        """Bytes of cache lines moved at `level` per kernel call, by loads or by stores."""
        return sum(op.executions * side.line_bytes for op, side in self.moves(direction, level))

    def describe(self) -> str:
        """The GIR as text: per phase its parallel unit and loop structure, then each gOperator (indented by the
        loop body it runs in; `outer`: once per iteration of the loops outside the innermost) with the slices it
        reads and writes (buffer@level[count x width / stride])."""
        lines = []
        for p, phase in enumerate(self.phases):
            unit = phase.parallel
            loops = " x ".join(f"{var}:{size}" for var, size in phase.loops) or "none"
            structure = [name for name, present in (("unrolled " + phase.unrolled, phase.unrolled),
                         (f"tiled: {phase.tiled}", phase.tiled), (f"{len(phase.pieces)} pieces", phase.pieces),
                         ("input rows permuted in registers", phase.row_permuted),
                         (f"{phase.reduction} reduction", phase.reduction), (f"{len(phase.steps)} row steps",
                         phase.steps), (f"in blocks of {phase.row_block} rows", phase.row_block),
                         *((f"summing as it stores into {st.slot}", True) for st in phase.steps if st.summed),
                         *((f"{st.slot} summed across rows", True) for st in phase.steps if st.across),
                         *((f"{st.slot} in one pass with the next", True) for st in phase.steps if st.joined),
                         *((f"{st.loops[0][0]} ends in an overlapping block of {st.overlapped_tail}", True)
                           for st in phase.steps if st.overlapped_tail))
                         if present]  # fmt: skip
            lines.append(f"phase {p}: loops {loops} ({unit.mode}{', ' if structure else ''}{', '.join(structure)}); "
                         f"{unit.iterations} iterations on {unit.threads} thread(s) x {unit.lanes} lanes")  # fmt: skip
            for op in phase.ops:
                reads = ", ".join(_slice_text(self.slices[s]) for s in op.reads)
                writes = ", ".join(_slice_text(self.slices[s]) for s in op.writes)
                indent, where = "  " * (1 + len(op.scope)), " outer" if op.outer else ""
                lines.append(f"{indent}{op.kind} {op.name} x{op.executions}{where}: {reads} -> {writes}")
        return "\n".join(lines)


def _slice_text(s: MemorySlice) -> str:
    return f"{s.buffer}@{s.level}[{s.count}x{s.width}/{s.stride}]"
