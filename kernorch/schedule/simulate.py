"""Predict an rProgram's time from measured rTask times (Rammer profiles rKernels the same way).

Each unit has three measured times (`UnitTimes`): run whole on one vEU inside a region, split evenly over all
vEUs inside a region (the time of one of the pieces), and as a device-wide call with its own parallel region.
A range of a split unit takes its share of the split time. The simulator walks rTasks in their global order (a
Wait only refers to lower-numbered rTasks, so every finish time it needs is known) and adds fixed costs for
barrier rTasks and for opening a region (unless it has work for vEU 0 only: then no team is forked).
"""

from __future__ import annotations

from dataclasses import dataclass

from kernorch.schedule.program import Call, Region, RProgram, RTask, Wait

WAIT_SECONDS = 0.15e-6  # a barrier rTask: an acquire load of another core's step counter, usually one miss
REGION_SECONDS = 2.0e-6  # opening and closing a persistent parallel region (fork, join) on two threads


@dataclass(frozen=True)
class UnitTimes:
    single: float  # whole on one vEU
    split: float  # each piece, split evenly over all vEUs
    device: float  # device-wide call (its own parallel region, all threads)


def piece_seconds(times: UnitTimes, share: float, veus: int) -> float:
    """A piece covering `share` of its unit's iterations: the whole unit on one vEU, or its share of the
    split time (measured with the unit split evenly over all `veus`)."""
    return times.single if share >= 1.0 else times.split * share * veus


def task_seconds(program: RProgram, times: list[UnitTimes], task: RTask) -> float:
    share = (task.end - task.begin) / program.units[task.unit].iterations
    return piece_seconds(times[task.unit], share, program.veus)


@dataclass(frozen=True)
class Timeline:
    seconds: float
    spans: dict[int, tuple[int, float, float]]  # rTask order -> (vEU, start, end); vEU -1: a call outside regions


def simulate(program: RProgram, times: list[UnitTimes]) -> Timeline:
    clock = 0.0
    spans: dict[int, tuple[int, float, float]] = {}
    for segment in program.segments:
        if isinstance(segment, Call):
            seconds = times[segment.task.unit].device
            spans[segment.task.order] = (-1, clock, clock + seconds)
            clock += seconds
            continue
        if any(segment.programs[1:]):  # a region with work for vEU 0 only runs without forking a team
            clock += REGION_SECONDS
        clock = _region(program, segment, times, clock, spans)
    return Timeline(clock, spans)


def _region(program: RProgram, region: Region, times: list[UnitTimes], start: float,
            spans: dict[int, tuple[int, float, float]]) -> float:  # fmt: skip
    finished = [[e.order for e in p if isinstance(e, RTask)] for p in region.programs]
    # each vEU's rTasks with the waits before them; walked in global order
    pending: list[tuple[int, int, RTask, list[Wait]]] = []
    for v, entries in enumerate(region.programs):
        waits: list[Wait] = []
        for entry in entries:
            if isinstance(entry, Wait):
                waits.append(entry)
            else:
                pending.append((entry.order, v, entry, waits))
                waits = []
    clocks = [start] * program.veus
    for _, v, task, waits in sorted(pending, key=lambda item: item[0]):
        ready = clocks[v] + WAIT_SECONDS * len(waits)
        for wait in waits:
            if wait.count:
                ready = max(ready, spans[finished[wait.veu][wait.count - 1]][2])
        end = ready + task_seconds(program, times, task)
        spans[task.order] = (v, ready, end)
        clocks[v] = end
    return max(clocks)
