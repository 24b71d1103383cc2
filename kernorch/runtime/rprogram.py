"""Run a plan as an rProgram (schedule/): calibrate its units in place, schedule them, run the schedule.

Calibration runs two fixed rPrograms a few times with tracing on: every unit on all vEUs in plan order
(split rTasks with a barrier between units; library and opaque kernels as device-wide calls), and every unit
whole on vEU 0. Their traces give each unit's split, single and device time (schedule/simulate.py), which the
wavefront policy schedules from; `build` then refines the times from the schedule's own run, and keeps the
fastest measured of the candidates (see there). Every rProgram is checked for deadlock freedom and dependency
coverage before it ever runs.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from kernorch.codegen.program import CALL, ENTRY_FIELDS, REGION, SEGMENT_FIELDS, TASK, WAIT
from kernorch.runtime.timing import time_call
from kernorch.schedule.program import Call, Entry, Region, RProgram, RTask, Segment, Unit, Wait, check_program
from kernorch.schedule.regions import kernel_by_kernel, per_region, slower_regions
from kernorch.schedule.simulate import UnitTimes, simulate
from kernorch.schedule.wavefront import schedule

CALIBRATION_RUNS = 5
PER_REGION = "per region"  # the wavefront rProgram with its slower regions kernel by kernel


@dataclass(frozen=True)
class EncodedBlock:
    """Consecutive native segments as the arrays `<prefix>_program` reads (codegen/program/rprogram.py)."""

    segments: np.ndarray  # int64 [count, 3]
    entries: np.ndarray  # int64 [n, 5]
    offsets: np.ndarray  # int64 [regions * (veus + 1)]


class RProgramRunner:
    """Runs rPrograms of one compiled plan. `program_fn` is the library's `<prefix>_program`; `run_call(kernel)`
    runs a kernel only Python can run; `on_failure(code)` raises for a nonzero code from the library."""

    def __init__(self, units: tuple[Unit, ...], predecessors: list[set[int]], veus: int, state: int,
                 table: ctypes.Array[ctypes.c_void_p], program_fn: Callable[..., int],
                 run_call: Callable[[int], None], on_failure: Callable[[int], None]) -> None:  # fmt: skip
        self.units, self.predecessors, self.veus = units, predecessors, veus
        self._state, self._table, self._program = state, table, program_fn
        self._run_call, self._on_failure = run_call, on_failure
        self.program: RProgram | None = None
        self.times: list[UnitTimes] = []  # calibrated (what the simulator predicts from)
        self.measured: dict[str, float] = {}  # build(): median seconds of each candidate rProgram
        self.choice = ""  # build(): the candidate in use
        self._steps: list[Callable[[np.ndarray | None], None]] = []
        self.tasks: list[RTask] = []  # the program's rTasks in global order

    # -- calibration and scheduling ---------------------------------------------------------------------------

    def kernel_by_kernel(self) -> RProgram:
        """Every unit on all vEUs in plan order: what the kernel-by-kernel runtime does, as an rProgram."""
        return RProgram(self.veus, self.units, tuple(kernel_by_kernel(self.units, self.veus)))

    def all_single(self) -> RProgram:
        """Every native unit whole on vEU 0, in plan order; Python's kernels as calls."""
        segments: list[Segment] = []
        mine: list[Entry] = []
        for u, unit in enumerate(self.units):
            if unit.native:
                mine.append(RTask(u, 0, unit.iterations, u))
                continue
            if mine:
                segments.append(Region((tuple(mine), *(() for _ in range(self.veus - 1)))))
                mine = []
            segments.append(Call(RTask(u, 0, unit.iterations, u)))
        if mine:
            segments.append(Region((tuple(mine), *(() for _ in range(self.veus - 1)))))
        return RProgram(self.veus, self.units, tuple(segments))

    def calibrate(self, runs: int = CALIBRATION_RUNS) -> list[UnitTimes]:
        split = self._unit_seconds(self.kernel_by_kernel(), runs)
        single = self._unit_seconds(self.all_single(), runs)
        self.times = [UnitTimes(single=single[u], split=split[u], device=split[u]) for u in range(len(self.units))]
        return self.times

    def _unit_seconds(self, program: RProgram, runs: int) -> list[float]:
        return self._spans(program, runs)[0]

    def _spans(self, program: RProgram, runs: int) -> tuple[list[float], list[float]]:
        """Median seconds from first start to last end of each unit's rTasks, and of each segment's, over `runs`
        traced runs of `program` (after one to warm up)."""
        self.use(program)
        segment_of = {t.order: s for s, segment in enumerate(program.segments) for t in _tasks_of(segment)}
        samples: list[list[float]] = [[] for _ in self.units]
        segment_samples: list[list[float]] = [[] for _ in program.segments]
        for repeat in range(runs + 1):
            spans = self.traced()
            if not repeat:
                continue  # the first run warms up
            first: dict[int, float] = {}
            last: dict[int, float] = {}
            for task, (_, start, end) in zip(self.tasks, spans, strict=True):
                for key in (task.unit, -1 - segment_of[task.order]):  # units, then segments as -1 - index
                    first[key] = min(first.get(key, start), start)
                    last[key] = max(last.get(key, end), end)
            for key in first:
                (samples[key] if key >= 0 else segment_samples[-1 - key]).append(last[key] - first[key])
        return _medians(samples), _medians(segment_samples)

    def build(self, runs: int = CALIBRATION_RUNS) -> RProgram:
        """Calibrate; schedule with the wavefront policy; schedule again with the times the first schedule
        showed when it ran (rTasks beside each other share caches and bandwidth, and data produced on another
        core is further away, which the calibration alone cannot see); compose the first schedule with its
        regions that ran slower than their kernels one by one run kernel by kernel (schedule/regions.py: the
        runtime chosen per region); then time these and the kernel-by-kernel rProgram in turns, and keep the
        fastest. Every candidate is checked before it runs."""
        times = self.calibrate(runs)
        first = schedule(self.units, self.predecessors, times, self.veus)
        refined, region_seconds = self._observed_times(first, runs)
        candidates = {"kernel by kernel": self.kernel_by_kernel(), "wavefront": first,
                      "wavefront, refined": schedule(self.units, self.predecessors, refined, self.veus)}  # fmt: skip
        replaced = slower_regions(first, region_seconds, [t.device for t in times])
        regions = sum(isinstance(segment, Region) for segment in first.segments)
        if 0 < len(replaced) < regions:  # else it is one of the candidates already
            candidates[PER_REGION] = per_region(first, replaced)
        self.measured = self._medians_in_turns(candidates, 2 * runs)
        self.choice = min(self.measured, key=lambda name: self.measured[name])
        self.use(candidates[self.choice])
        self.times = times
        return candidates[self.choice]

    def _observed_times(self, program: RProgram, runs: int) -> tuple[list[UnitTimes], list[float]]:
        """The calibrated times, with each unit's time in the variant `program` runs it in replaced by what
        the unit took when `program` ran; and what each of its segments took."""
        observed, segment_seconds = self._spans(program, runs)
        variant: dict[int, str] = {}
        for segment in program.segments:
            if isinstance(segment, Call):
                variant[segment.task.unit] = "device"
            else:
                for _, task in segment.tasks():
                    whole = task.begin == 0 and task.end == self.units[task.unit].iterations
                    variant[task.unit] = "single" if whole else "split"
        times = [replace(t, **{variant[u]: observed[u]}) if u in variant else t for u, t in enumerate(self.times)]
        return times, segment_seconds

    def _medians_in_turns(self, candidates: dict[str, RProgram], runs: int) -> dict[str, float]:
        """Median seconds of each candidate, timed in turns (one run of each, `runs` rounds): a burst of noise on
        a shared host, which lasts seconds, then falls on every candidate alike instead of on the one timed then
        (candy's kernel-by-kernel candidate once measured 117 ms beside 67 ms for a schedule that ran 90 ms)."""
        prepared = {}
        for name, program in candidates.items():
            self.use(program)
            prepared[name] = (program, self.tasks, self._steps)
        samples: dict[str, list[float]] = {name: [] for name in candidates}
        for round_index in range(runs + 1):
            for name, (program, tasks, steps) in prepared.items():
                self.program, self.tasks, self._steps = program, tasks, steps
                timing = time_call(self.run, runs=1, warmup=0)
                if round_index:  # the first round warms up
                    samples[name].extend(timing.samples)
        return {name: float(np.median(times)) for name, times in samples.items()}

    def adopt(self, other: RProgramRunner) -> None:
        """Run what `other` (a runner of the same plan, built) chose, without calibrating again."""
        assert other.program is not None
        self.times, self.measured, self.choice = other.times, other.measured, other.choice
        self.use(other.program)

    def predicted_seconds(self) -> float:
        assert self.program is not None
        return simulate(self.program, self.times).seconds

    # -- running ---------------------------------------------------------------------------------------------

    def use(self, program: RProgram) -> None:
        """Check `program` and run it from now on: each stretch of native segments with one foreign call."""
        check_program(program, self.predecessors)
        self.program = program
        self.tasks = sorted((t for s in program.segments for t in _tasks_of(s)), key=lambda t: t.order)
        self._steps = []
        stretch: list[Segment] = []
        for segment in program.segments:
            if isinstance(segment, Call) and not self.units[segment.task.unit].native:
                if stretch:
                    self._steps.append(self._native_step(_encode(stretch, self.units, self.veus)))
                    stretch = []
                self._steps.append(self._python_step(segment))
            else:
                stretch.append(segment)
        if stretch:
            self._steps.append(self._native_step(_encode(stretch, self.units, self.veus)))

    def _native_step(self, block: EncodedBlock) -> Callable[[np.ndarray | None], None]:
        pointers = [a.ctypes.data_as(ctypes.c_void_p) for a in (block.segments, block.entries, block.offsets)]
        count = len(block.segments)

        def step(trace: np.ndarray | None) -> None:
            target = trace.ctypes.data_as(ctypes.c_void_p) if trace is not None else None
            failed = self._program(self._state, self._table, pointers[0], count, pointers[1], pointers[2],
                                   self.veus, target)  # fmt: skip
            if failed:
                self._on_failure(failed)

        step.keep = block  # type: ignore[attr-defined]  # the arrays must outlive the pointers
        return step

    def _python_step(self, call: Call) -> Callable[[np.ndarray | None], None]:
        kernel, order = self.units[call.task.unit].kernel, call.task.order

        def step(trace: np.ndarray | None) -> None:
            if trace is None:
                self._run_call(kernel)
                return
            start = time.monotonic_ns()
            self._run_call(kernel)
            trace[2 * order], trace[2 * order + 1] = start, time.monotonic_ns()

        return step

    def run(self) -> None:
        for step in self._steps:
            step(None)

    def traced(self) -> list[tuple[int, float, float]]:
        """One run with timestamps: per rTask in global order, (vEU or -1 for a call, start s, end s) measured
        from the run's start."""
        assert self.program is not None
        trace = np.zeros(2 * self.program.task_count, dtype=np.int64)
        began = time.monotonic_ns()
        for step in self._steps:
            step(trace)
        veu_of = {t.order: v for s in self.program.segments if isinstance(s, Region) for v, t in s.tasks()}
        return [(veu_of.get(t.order, -1), (trace[2 * t.order] - began) * 1e-9,
                 (trace[2 * t.order + 1] - began) * 1e-9) for t in self.tasks]  # fmt: skip


def _medians(groups: list[list[float]]) -> list[float]:
    return [float(np.median(s)) if s else 0.0 for s in groups]


def _tasks_of(segment: Segment) -> list[RTask]:
    return [segment.task] if isinstance(segment, Call) else [t for _, t in segment.tasks()]


def _encode(segments: list[Segment], units: tuple[Unit, ...], veus: int) -> EncodedBlock:
    rows: list[tuple[int, int, int, int, int]] = []
    offsets: list[int] = []
    table: list[tuple[int, int, int]] = []
    for segment in segments:
        if isinstance(segment, Call):
            table.append((CALL, units[segment.task.unit].kernel, segment.task.order))
            continue
        table.append((REGION, len(offsets) // (veus + 1), 0))
        offsets.append(len(rows))
        for entries in segment.programs:
            for entry in entries:
                if isinstance(entry, Wait):
                    rows.append((WAIT, entry.veu, entry.count, 0, 0))
                else:
                    rows.append((TASK, entry.unit, entry.begin, entry.end, entry.order))
            offsets.append(len(rows))
    return EncodedBlock(np.array(table, dtype=np.int64).reshape(-1, SEGMENT_FIELDS),
                        np.array(rows, dtype=np.int64).reshape(-1, ENTRY_FIELDS),
                        np.array(offsets, dtype=np.int64))  # fmt: skip
