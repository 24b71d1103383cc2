"""rPrograms cannot deadlock or race: random DAGs, random variants and random placements, each run by an
interpreter that interleaves the vEUs at random, plus programs that are wrong on purpose."""

from __future__ import annotations

import random

import pytest

from kernorch.schedule.program import Call, Region, RProgram, RTask, ScheduleError, Unit, Wait, check_program
from kernorch.schedule.simulate import UnitTimes, simulate
from kernorch.schedule.wavefront import DEVICE, SINGLE, SPLIT, _Builder, _even, schedule, variants, waves


def random_dag(rng: random.Random, count: int) -> tuple[list[Unit], list[set[int]]]:
    units: list[Unit] = []
    preds: list[set[int]] = []
    for u in range(count):
        kind = rng.random()
        if kind < 0.6:
            units.append(Unit(u, 0, rng.choice([1, 2, 3, 7, 64]), splittable=True, native=True))
        elif kind < 0.9:
            units.append(Unit(u, 0, 1, splittable=False, native=True))
        else:
            units.append(Unit(u, 0, 1, splittable=False, native=False))
        # mostly local edges with a few long ones: branchy like a NAS cell
        candidates = list(range(max(0, u - 6), u))
        preds.append(set(rng.sample(candidates, k=min(len(candidates), rng.choice([0, 1, 1, 2, 3])))))
        if u > 8 and rng.random() < 0.2:
            preds[-1].add(rng.randrange(u - 8))
    return units, preds


def _random_times(rng: random.Random, units: list[Unit]) -> list[UnitTimes]:
    times = []
    for _ in units:
        single = rng.uniform(1e-6, 1e-3)
        split, device = single * rng.uniform(0.5, 1.2), single * rng.uniform(0.5, 1)
        times.append(UnitTimes(single=single, split=split, device=device))
    return times


def random_placement(rng: random.Random, units: list[Unit], preds: list[set[int]], veus: int) -> RProgram:
    """Any topological order, any variant, any vEU: what the scheduler could ever emit."""
    builder = _Builder(tuple(units), veus, _random_times(rng, units))
    order = list(range(len(units)))
    placed: set[int] = set()
    while order:
        ready = [u for u in order if preds[u] <= placed]
        unit = rng.choice(ready)
        order.remove(unit)
        placed.add(unit)
        option = rng.choice(variants(units[unit], veus))
        if option == SPLIT:
            pieces = _even(units[unit].iterations, veus)
            builder.place(unit, preds[unit], pieces, [rng.randrange(veus) for _ in pieces])  # any piece anywhere
        elif option == SINGLE:
            builder.place(unit, preds[unit], [(0, units[unit].iterations)], [rng.randrange(veus)])
        else:
            builder.call(unit)
    builder.close()
    return RProgram(veus, tuple(units), tuple(builder.segments))


def interpret(program: RProgram, preds: list[set[int]], rng: random.Random) -> None:
    """Run the program with the vEUs interleaved at random; fail on a deadlock or a task that starts before a
    predecessor's last rTask has finished."""
    finished: dict[int, int] = {}  # unit -> rTasks finished
    total = {u: 0 for u in range(len(program.units))}
    for segment in program.segments:
        for task in [segment.task] if isinstance(segment, Call) else [t for _, t in segment.tasks()]:
            total[task.unit] += 1

    def run(task: RTask) -> None:
        for pred in preds[task.unit]:
            assert finished.get(pred, 0) == total[pred], f"unit {task.unit} started before unit {pred} finished"
        finished[task.unit] = finished.get(task.unit, 0) + 1

    for segment in program.segments:
        if isinstance(segment, Call):
            run(segment.task)
            continue
        cursor = [0] * program.veus
        done = [0] * program.veus
        while True:
            movable = []
            for v, entries in enumerate(segment.programs):
                if cursor[v] < len(entries):
                    entry = entries[cursor[v]]
                    if not isinstance(entry, Wait) or done[entry.veu] >= entry.count:
                        movable.append(v)
            if not movable:
                assert all(cursor[v] == len(p) for v, p in enumerate(segment.programs)), "deadlock"
                break
            v = rng.choice(movable)
            entry = segment.programs[v][cursor[v]]
            cursor[v] += 1
            if isinstance(entry, RTask):
                run(entry)
                done[v] += 1
    assert finished == total


@pytest.mark.parametrize("seed", range(40))
def test_random_placements_never_deadlock_or_race(seed: int) -> None:
    rng = random.Random(seed)
    units, preds = random_dag(rng, rng.randrange(2, 40))
    veus = rng.choice([1, 2, 3, 4])
    program = random_placement(rng, units, preds, veus)
    check_program(program, preds)
    for _ in range(5):
        interpret(program, preds, rng)


@pytest.mark.parametrize("seed", range(20))
def test_wavefront_programs_are_valid_and_not_slower_than_kernel_by_kernel(seed: int) -> None:
    rng = random.Random(100 + seed)
    units, preds = random_dag(rng, rng.randrange(2, 60))
    times = _random_times(rng, units)
    program = schedule(units, preds, times, 2)
    check_program(program, preds)
    interpret(program, preds, rng)
    # the first choice of every wave is each unit's fastest variant alone, kept unless a trial is faster
    seconds = {SPLIT: lambda t: t.split, SINGLE: lambda t: t.single, DEVICE: lambda t: t.device}
    serial = sum(min(seconds[v](t) for v in variants(unit, 2)) for unit, t in zip(units, times, strict=True))
    assert simulate(program, times).seconds <= serial * 1.05 + 1e-4


def test_waves_are_bfs_levels() -> None:
    assert waves([set(), set(), {0}, {1, 2}, {0}]) == [[0, 1], [2, 4], [3]]


def test_independent_branches_run_side_by_side() -> None:
    """Four independent single-threaded units of equal time on two vEUs: two per vEU, no barrier."""
    units = [Unit(u, 0, 1, splittable=False, native=True) for u in range(4)]
    times = [UnitTimes(single=1e-4, split=1e-4, device=0.8e-4)] * 4
    program = schedule(units, [set()] * 4, times, 2)
    (region,) = program.segments
    assert isinstance(region, Region)
    assert [len(p) for p in region.programs] == [2, 2]
    assert simulate(program, times).seconds < 2 * 1e-4 + 1e-5  # device-wide one after another: 3.2e-4


def _two_veus(first: list[RTask | Wait], second: list[RTask | Wait], units: int) -> RProgram:
    return RProgram(2, tuple(Unit(u, 0, 1, splittable=False, native=True) for u in range(units)),
                    (Region((tuple(first), tuple(second))),))  # fmt: skip


def test_a_wait_for_a_later_rtask_is_refused() -> None:
    # vEU 0 waits for rTask 3 before running rTask 0, vEU 1 waits for rTask 0 before rTask 3: a cycle
    program = _two_veus([Wait(1, 1), RTask(0, 0, 1, 0)], [Wait(0, 1), RTask(1, 0, 1, 3)], 2)
    with pytest.raises(ScheduleError, match="later one"):
        check_program(program, [set(), {0}])
    with pytest.raises(AssertionError, match="deadlock"):
        interpret(program, [set(), {0}], random.Random(0))


def test_a_missing_wait_is_refused() -> None:
    program = _two_veus([RTask(0, 0, 1, 0)], [RTask(1, 0, 1, 1)], 2)
    with pytest.raises(ScheduleError, match="can start before unit 0"):
        check_program(program, [set(), {0}])


def test_a_unit_run_twice_or_partly_is_refused() -> None:
    twice = _two_veus([RTask(0, 0, 1, 0)], [RTask(0, 0, 1, 1)], 1)
    with pytest.raises(ScheduleError, match="runs iterations"):
        check_program(twice, [set()])
    units = (Unit(0, 0, 8, splittable=True, native=True),)
    partly = RProgram(2, units, (Region(((RTask(0, 0, 4, 0),), ())),))
    with pytest.raises(ScheduleError, match="runs iterations"):
        check_program(partly, [set()])


def test_python_units_never_run_inside_a_region() -> None:
    units = (Unit(0, 0, 1, splittable=False, native=False),)
    with pytest.raises(ScheduleError, match="only Python"):
        check_program(RProgram(2, units, (Region(((RTask(0, 0, 1, 0),), ())),)), [set()])
