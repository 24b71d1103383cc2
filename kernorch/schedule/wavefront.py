"""Rammer's wavefront policy (Algorithm 1) on CPU threads: units in BFS waves, a variant chosen per unit, rTasks
placed where they can start earliest.

For each wave (units whose predecessors are all in earlier waves) every unit has up to three variants:
- split: a generated kernel's phase cut into one rTask per vEU (the fast kernel, all threads);
- single: one rTask on the vEU that can start it first (the resource-efficient kernel: the other vEUs run
  other units of the wave beside it);
- device: a library or opaque kernel on all threads with its own parallel region, outside the rProgram; it
  ends the current region, so the wave is not merged with what came before.
The wave starts from the best (by simulated time) of three whole-wave choices: each unit's fastest variant, every
unit single, every unit merged into the region; then, largest first, it keeps another variant for a unit only
when the simulated time of everything placed so far goes down (Rammer keeps a wave merged into the rProgram only
when profiled times say it helps). Placement adds a barrier rTask before an rTask for every predecessor's
rTask on another vEU of the same region that the vEU has not already waited for.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from kernorch.schedule.program import Call, Entry, Region, RProgram, RTask, Segment, Unit, Wait
from kernorch.schedule.simulate import REGION_SECONDS, WAIT_SECONDS, UnitTimes, piece_seconds

SPLIT, SINGLE, DEVICE = "split", "single", "device"


def waves(predecessors: Sequence[set[int]]) -> list[list[int]]:
    """Units grouped by BFS level over the dependency DAG (predecessors come before their units)."""
    level: list[int] = []
    for preds in predecessors:
        level.append(1 + max((level[p] for p in preds), default=-1))
    grouped: dict[int, list[int]] = {}
    for unit, lvl in enumerate(level):
        grouped.setdefault(lvl, []).append(unit)
    return [grouped[lvl] for lvl in sorted(grouped)]


def variants(unit: Unit, veus: int) -> list[str]:
    if not unit.native:
        return [DEVICE]
    options = [SPLIT] if unit.splittable and unit.iterations >= veus > 1 else []
    options.append(SINGLE)
    if not unit.splittable:
        options.append(DEVICE)
    return options


@dataclass
class _Builder:
    """The rProgram placed so far, with simulated clocks."""

    units: tuple[Unit, ...]
    veus: int
    times: list[UnitTimes]
    segments: list[Segment] = field(default_factory=list)
    programs: list[list[Entry]] = field(default_factory=list)
    clocks: list[float] = field(default_factory=list)
    done: list[int] = field(default_factory=list)  # rTasks placed per vEU in the open region
    seen: list[list[int]] = field(default_factory=list)  # seen[v][j]: rTasks of vEU j that vEU v has waited for
    where: dict[int, list[tuple[int, int, float]]] = field(default_factory=dict)  # unit -> (vEU, position, end)
    order: int = 0
    now: float = 0.0  # when the open region started (or everything before it ended)

    def __post_init__(self) -> None:
        self._open(0.0)

    def _open(self, start: float) -> None:
        self.programs = [[] for _ in range(self.veus)]
        # a region with work for vEU 0 only runs on the calling thread; the others start after the fork
        self.clocks = [start] + [start + REGION_SECONDS] * (self.veus - 1)
        self.done = [0] * self.veus
        self.seen = [[0] * self.veus for _ in range(self.veus)]
        self.where = {}
        self.now = start

    def copy(self) -> _Builder:
        twin = _Builder(self.units, self.veus, self.times, list(self.segments))
        twin.programs = [list(p) for p in self.programs]
        twin.clocks, twin.done = list(self.clocks), list(self.done)
        twin.seen = [list(row) for row in self.seen]
        twin.where = {u: list(w) for u, w in self.where.items()}
        twin.order, twin.now = self.order, self.now
        return twin

    @property
    def finish(self) -> float:
        return max(self.clocks) if any(self.programs) else self.now

    def close(self) -> None:
        if any(self.programs):
            self.segments.append(Region(tuple(tuple(p) for p in self.programs)))
        self._open(self.finish)

    def call(self, unit: int) -> None:
        self.close()
        self.segments.append(Call(RTask(unit, 0, self.units[unit].iterations, self.order)))
        self.order += 1
        self._open(self.now + self.times[unit].device)

    def place(self, unit: int, preds: set[int], pieces: list[tuple[int, int]],
              on: Sequence[int] | None = None) -> None:  # fmt: skip
        """Place `pieces` (ranges) of `unit`, piece i on vEU on[i]; without `on`, one piece goes to the vEU that
        can start it first and several to vEUs 0, 1, ..."""
        if on is None:
            on = [min(range(self.veus), key=lambda v: (self._ready(v, preds)[0], v))] if len(pieces) == 1 \
                else list(range(len(pieces)))  # fmt: skip
        placed: list[tuple[int, int, float]] = []
        for (begin, end), v in zip(pieces, on, strict=True):
            start, waits = self._ready(v, preds)
            for j, count in waits.items():
                self.programs[v].append(Wait(j, count))
                self.seen[v][j] = count
            task = RTask(unit, begin, end, self.order)
            self.order += 1
            self.programs[v].append(task)
            seconds = piece_seconds(self.times[unit], (end - begin) / self.units[unit].iterations, self.veus)
            self.clocks[v] = start + WAIT_SECONDS * len(waits) + seconds
            self.done[v] += 1
            placed.append((v, self.done[v], self.clocks[v]))
        self.where[unit] = placed

    def _ready(self, v: int, preds: set[int]) -> tuple[float, dict[int, int]]:
        """When vEU v could start a unit with these predecessors, and the waits it needs first."""
        start = self.clocks[v]
        waits: dict[int, int] = {}
        for pred in preds:
            for j, count, end in self.where.get(pred, ()):  # absent: in an earlier segment, already finished
                start = max(start, end)
                if j != v and count > max(self.seen[v][j], waits.get(j, 0)):
                    waits[j] = count
        return start, waits


def _even(iterations: int, parts: int) -> list[tuple[int, int]]:
    return [(iterations * i // parts, iterations * (i + 1) // parts) for i in range(parts)]


def _apply(builder: _Builder, wave: list[int], choice: dict[int, str], predecessors: Sequence[set[int]]) -> None:
    # region rTasks first (longest first, so short ones fill the gaps), then the device-wide calls
    in_region = [u for u in wave if choice[u] != DEVICE]
    in_region.sort(key=lambda u: -max(builder.times[u].single, builder.times[u].split))
    for unit in in_region:
        iterations = builder.units[unit].iterations
        if choice[unit] == SPLIT:
            builder.place(unit, predecessors[unit], _even(iterations, builder.veus), None)
        else:
            builder.place(unit, predecessors[unit], [(0, iterations)], None)
    for unit in wave:
        if choice[unit] == DEVICE:
            builder.call(unit)


def schedule(units: Sequence[Unit], predecessors: Sequence[set[int]], times: list[UnitTimes],
             veus: int) -> RProgram:  # fmt: skip
    """The rProgram of `units` (in a topological order: every predecessor has a lower index)."""
    builder = _Builder(tuple(units), veus, times)
    for wave in waves(predecessors):
        # whole-wave starting points: each unit's fastest variant alone; every unit on one vEU (the
        # resource-efficient kernels side by side); everything merged into the region (split where possible)
        starts = [{u: _fastest(units[u], times[u], veus) for u in wave},
                  {u: SINGLE if SINGLE in variants(units[u], veus) else DEVICE for u in wave},
                  {u: variants(units[u], veus)[0] for u in wave}]  # fmt: skip
        scored = [(_trial(builder, wave, start, predecessors), i) for i, start in enumerate(starts)]
        best, index = min(scored)
        choice = starts[index]
        # then, largest unit first, another variant for one unit is kept when it shortens the program
        for unit in sorted(wave, key=lambda u: -times[u].single):
            for option in variants(units[unit], veus):
                if option == choice[unit]:
                    continue
                trial = {**choice, unit: option}
                finish = _trial(builder, wave, trial, predecessors)
                if finish < best:
                    best, choice = finish, trial
        _apply(builder, wave, choice, predecessors)
    builder.close()
    return RProgram(veus, tuple(units), tuple(builder.segments))


def _fastest(unit: Unit, times: UnitTimes, veus: int) -> str:
    options = variants(unit, veus)
    seconds = {SPLIT: times.split, SINGLE: times.single, DEVICE: times.device}
    return min(options, key=lambda option: seconds[option])


def _trial(builder: _Builder, wave: list[int], choice: dict[int, str], predecessors: Sequence[set[int]]) -> float:
    twin = builder.copy()
    _apply(twin, wave, choice, predecessors)
    return twin.finish
