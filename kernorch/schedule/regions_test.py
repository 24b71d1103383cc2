"""The runtime per region (schedule/regions.py): any regions of any valid rProgram replaced by their units kernel
by kernel give a valid rProgram (no deadlock, no race, every unit once, rTasks numbered densely); the regions
chosen are exactly those their kernels alone beat."""

from __future__ import annotations

import random

import pytest

from kernorch.devtools.mutate import here
from kernorch.schedule.program import Call, Region, RProgram, RTask, Unit, Wait, check_program
from kernorch.schedule.program_test import interpret, random_dag, random_placement
from kernorch.schedule.regions import kernel_by_kernel, per_region, region_units, slower_regions


def _region_indices(program: RProgram) -> list[int]:
    return [s for s, segment in enumerate(program.segments) if isinstance(segment, Region)]


@pytest.mark.parametrize("seed", range(40))
def test_any_regions_replaced_kernel_by_kernel_stay_valid(seed: int) -> None:
    rng = random.Random(300 + seed)
    units, preds = random_dag(rng, rng.randrange(2, 40))
    veus = rng.choice([1, 2, 3, 4])
    program = random_placement(rng, units, preds, veus)
    regions = _region_indices(program)
    replaced = set(rng.sample(regions, k=rng.randrange(len(regions) + 1)))
    mixed = per_region(program, replaced)
    check_program(mixed, preds)
    for _ in range(3):
        interpret(mixed, preds, rng)
    orders = sorted(t.order for s in mixed.segments for t in ([s.task] if isinstance(s, Call) else
                                                              [t for _, t in s.tasks()]))  # fmt: skip
    assert orders == list(range(mixed.task_count))
    # the regions kept are the same segments, only renumbered
    kept = [region_units(program.segments[s]) for s in regions if s not in replaced]  # type: ignore[arg-type]
    assert all(any(region_units(r) == units_of for r in mixed.segments if isinstance(r, Region)) for units_of in kept)


def test_no_region_replaced_is_the_program_and_every_region_replaced_runs_each_unit_on_all_vevus() -> None:
    rng = random.Random(7)
    units, preds = random_dag(rng, 30)
    program = random_placement(rng, units, preds, 2)
    assert per_region(program, set()).segments == program.segments  # the builder numbers densely already
    everything = per_region(program, set(_region_indices(program)))
    check_program(everything, preds)
    for segment in everything.segments:
        if isinstance(segment, Region):
            for v, task in segment.tasks():
                unit = units[task.unit]
                assert unit.splittable and (task.begin, task.end) == (
                    unit.iterations * v // min(2, unit.iterations),
                    unit.iterations * (v + 1) // min(2, unit.iterations),
                )


def test_slower_regions_compares_a_region_with_its_kernels_one_by_one() -> None:
    """Region 0 runs units 0 and 1 side by side in 3 ms; alone each takes 1 ms on both threads: replaced. Region 2
    runs units 3 and 4 in 1 ms; alone 0.8 + 0.7: kept."""
    units = tuple(Unit(u, 0, 1, splittable=False, native=True) for u in range(5))
    program = RProgram(2, units, (
        Region(((RTask(0, 0, 1, 0),), (RTask(1, 0, 1, 1),))),
        Call(RTask(2, 0, 1, 2)),
        Region(((RTask(3, 0, 1, 3),), (RTask(4, 0, 1, 4),))),
    ))  # fmt: skip
    assert slower_regions(program, [3e-3, 5e-4, 1e-3], [1e-3, 1e-3, 5e-4, 0.8e-3, 0.7e-3]) == {0}
    mixed = per_region(program, {0})
    check_program(mixed, [set(), set(), {0, 1}, {2}, {2}])
    assert mixed.segments[:2] == (Call(RTask(0, 0, 1, 0)), Call(RTask(1, 0, 1, 1)))
    assert mixed.segments[2:] == program.segments[1:]


def test_kernel_by_kernel_of_a_subset_runs_it_in_plan_order() -> None:
    units = [Unit(0, 0, 4, True, True), Unit(1, 0, 1, False, True), Unit(2, 0, 6, True, True)]
    segments = kernel_by_kernel(units, 2, {2, 0})
    assert segments == [Region(((RTask(0, 0, 2, 0), Wait(1, 1), RTask(2, 0, 3, 2)),
                                (RTask(0, 2, 4, 1), Wait(0, 1), RTask(2, 3, 6, 3))))]  # fmt: skip


# The mutants of the code this file tests, each a one-line change a real bug could make and that these tests must
# catch (`make mutate`: kernorch/devtools/mutate.py collects them)
MUTANTS = [
    here("the per-region rProgram keeps the regions that ran slower than their kernels",
         "if alone < region_seconds[s]:",
         "if alone > region_seconds[s]:"),
    here("the per-region rProgram leaves a replaced region's rTask numbers as they were",
         "return RProgram(program.veus, program.units, _renumbered(segments))",
         "return RProgram(program.veus, program.units, tuple(segments))"),
]  # fmt: skip
