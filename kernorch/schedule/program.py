"""rPrograms (Rammer §3): a plan's kernels as rTasks placed statically on virtual execution units (vEUs).

A *unit* is what the scheduler places: one phase of a generated kernel (its parallel loop can be cut into
rTasks, each a range of its iterations), or a whole library/opaque kernel (one rTask on one vEU, or a
*device-wide* call on all threads). The vEUs are the threads of one persistent OpenMP parallel region; each
runs its own static list of entries: rTasks, and barrier rTasks (`Wait`: until vEU j has finished its first
c rTasks of the region, read from a per-vEU step counter, Rammer's step array). A device-wide call or a kernel
only Python runs ends the region (`Call`), so an rProgram is a sequence of segments.

Deadlock freedom: every rTask carries a number in one global topological order, each vEU runs its rTasks in
increasing order, and a Wait before rTask T only waits for rTasks numbered below T. Then the unfinished rTask
with the lowest number can always run (all it waits for is numbered lower, so finished), and by induction
every rTask finishes. `check_program` verifies this, that the rTasks of every unit cover its iterations
exactly once, and that every dependency is ordered by program order, a Wait, or a segment boundary.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kernorch.errors import KernorchError

TASKS, SINGLE, DEVICE, PYTHON = "tasks", "single", "device", "python"


class ScheduleError(KernorchError):
    """An rProgram that could deadlock or race: refused before it runs."""


@dataclass(frozen=True)
class Unit:
    kernel: int  # position in the plan
    phase: int  # phase of a generated kernel (0 otherwise)
    iterations: int  # trip count of its parallel loop: the most rTasks it splits into (1: not splittable)
    splittable: bool  # a generated kernel's phase (rTasks of ranges); else its function runs whole
    native: bool  # False: only Python runs it (a reference kernel), so it ends the native program


@dataclass(frozen=True)
class RTask:
    unit: int
    begin: int
    end: int
    order: int  # position in the global topological order (also the trace slot of its timestamps)


@dataclass(frozen=True)
class Wait:
    veu: int
    count: int  # wait until vEU `veu` has finished this many rTasks of the region


Entry = RTask | Wait


@dataclass(frozen=True)
class Region:
    programs: tuple[tuple[Entry, ...], ...]  # per vEU

    def tasks(self) -> list[tuple[int, RTask]]:
        return [(v, e) for v, program in enumerate(self.programs) for e in program if isinstance(e, RTask)]


@dataclass(frozen=True)
class Call:
    """A unit run outside any region: device-wide (a kernel with its own parallel region) or by Python."""

    task: RTask


Segment = Region | Call


@dataclass(frozen=True)
class RProgram:
    veus: int
    units: tuple[Unit, ...]
    segments: tuple[Segment, ...]

    @property
    def task_count(self) -> int:
        return sum(len(s.tasks()) if isinstance(s, Region) else 1 for s in self.segments)

    def describe(self) -> str:
        regions = [s for s in self.segments if isinstance(s, Region)]
        calls = len(self.segments) - len(regions)
        waits = sum(isinstance(e, Wait) for r in regions for p in r.programs for e in p)
        return (f"{len(self.units)} units as {self.task_count} rTasks on {self.veus} vEUs: {len(regions)} "
                f"regions, {calls} calls outside them, {waits} barrier rTasks")  # fmt: skip


def check_program(program: RProgram, predecessors: Sequence[set[int]]) -> None:
    """Raise ScheduleError unless `program` runs every unit exactly once, respects every dependency
    (`predecessors[u]`: units u must wait for) and cannot deadlock (see the module docstring)."""
    covered: dict[int, list[tuple[int, int]]] = {u: [] for u in range(len(program.units))}
    orders: set[int] = set()
    # where each unit's rTasks ran: segment index, and per rTask (vEU, position among that vEU's rTasks)
    placed: dict[int, list[tuple[int, int, int]]] = {u: [] for u in range(len(program.units))}
    for s, segment in enumerate(program.segments):
        if isinstance(segment, Call):
            _record(segment.task, covered, orders)
            placed[segment.task.unit].append((s, -1, -1))
            continue
        if len(segment.programs) != program.veus:
            raise ScheduleError(f"region {s} has {len(segment.programs)} programs for {program.veus} vEUs")
        for v, entries in enumerate(segment.programs):
            done, last = 0, -1
            for entry in entries:
                if isinstance(entry, Wait):
                    continue
                if not program.units[entry.unit].native:
                    raise ScheduleError(f"region {s} runs unit {entry.unit}, which only Python can run")
                if entry.order <= last:
                    raise ScheduleError(f"vEU {v} of region {s} runs rTask {entry.order} after {last}")
                last = entry.order
                _record(entry, covered, orders)
                placed[entry.unit].append((s, v, done))
                done += 1
    for u, ranges in covered.items():
        unit = program.units[u]
        if sorted(ranges) != _tiling(sorted(ranges), unit.iterations):
            raise ScheduleError(f"unit {u} (kernel {unit.kernel}) runs iterations {sorted(ranges)} of "
                                f"{unit.iterations}")  # fmt: skip
    for s, segment in enumerate(program.segments):
        if isinstance(segment, Region):
            _check_region(program, s, segment, placed, predecessors)
        else:
            _check_call(s, segment, placed, predecessors)


def _record(task: RTask, covered: dict[int, list[tuple[int, int]]], orders: set[int]) -> None:
    if task.unit not in covered:
        raise ScheduleError(f"rTask {task.order} runs unit {task.unit}, which does not exist")
    if task.order in orders:
        raise ScheduleError(f"two rTasks are numbered {task.order}")
    orders.add(task.order)
    covered[task.unit].append((task.begin, task.end))


def _tiling(ranges: list[tuple[int, int]], iterations: int) -> list[tuple[int, int]]:
    """`ranges` when they tile [0, iterations) without gaps or overlaps, else a list that differs from it."""
    at = 0
    for begin, end in ranges:
        if begin != at or end <= begin:
            return []
        at = end
    return ranges if at == iterations else []


def _check_call(s: int, call: Call, placed: dict[int, list[tuple[int, int, int]]],
                predecessors: Sequence[set[int]]) -> None:  # fmt: skip
    for pred in predecessors[call.task.unit]:
        if any(ps >= s for ps, _, _ in placed[pred]):
            raise ScheduleError(f"unit {call.task.unit} runs in segment {s} before unit {pred} it depends on")


def _check_region(program: RProgram, s: int, region: Region, placed: dict[int, list[tuple[int, int, int]]],
                  predecessors: Sequence[set[int]]) -> None:  # fmt: skip
    order_of: list[list[int]] = [[e.order for e in p if isinstance(e, RTask)] for p in region.programs]
    for v, entries in enumerate(region.programs):
        seen = [0] * program.veus  # rTasks of each vEU this vEU has waited for so far
        done = 0
        for i, entry in enumerate(entries):
            if isinstance(entry, Wait):
                if not 0 <= entry.veu < program.veus or entry.count > len(order_of[entry.veu]):
                    raise ScheduleError(f"vEU {v} of region {s} waits for {entry.count} rTasks of vEU {entry.veu}")
                nxt = next((e for e in entries[i:] if isinstance(e, RTask)), None)
                if entry.count and nxt is not None and order_of[entry.veu][entry.count - 1] >= nxt.order:
                    raise ScheduleError(f"vEU {v} of region {s} waits before rTask {nxt.order} for rTask "
                                        f"{order_of[entry.veu][entry.count - 1]}: a later one (can deadlock)")
                seen[entry.veu] = max(seen[entry.veu], entry.count)
                continue
            seen[v] = done  # its own earlier rTasks are finished by program order
            for pred in predecessors[entry.unit]:
                for ps, pv, position in placed[pred]:
                    if ps < s:
                        continue
                    if ps > s or position >= seen[pv]:
                        raise ScheduleError(f"rTask {entry.order} (unit {entry.unit}) can start before unit {pred}"
                                            f" it depends on has finished on vEU {pv}")  # fmt: skip
            done += 1
