"""Dependencies come from bytes: read-after-write, write-after-read (arena reuse), write-after-write, and never
read-after-read; a generated kernel's phases run in order."""

from __future__ import annotations

from kernorch.schedule.hazards import kernel_dependencies, unit_dependencies
from kernorch.schedule.program import Unit


def test_conflicts_on_bytes_not_names() -> None:
    a, b, c = (0, 100), (200, 300), (50, 60)  # c lies inside a: a view, or a value reusing a's arena bytes
    reads = [[], [a], [], [b, a], [c], [b]]
    writes = [[a], [(400, 500)], [b], [(600, 700)], [(800, 900)], [c]]
    preds = kernel_dependencies(reads, writes)
    assert preds[1] == {0}  # read after write
    assert preds[2] == set()  # unrelated bytes
    assert preds[3] == {0, 2}  # reads a and b; reading a beside kernel 1's read of a is no conflict
    assert preds[4] == {0}  # reads bytes inside a
    # writes c: after kernel 0 wrote it (WAW) and kernels 1, 3, 4 read it (WAR); reads b after kernel 2 wrote it
    assert preds[5] == {0, 1, 2, 3, 4}


def test_phases_run_in_order_and_wait_for_the_last_phase_of_a_predecessor() -> None:
    units = [Unit(0, 0, 4, True, True), Unit(0, 1, 4, True, True), Unit(1, 0, 1, False, True),
             Unit(2, 0, 8, True, True), Unit(2, 1, 8, True, True)]  # fmt: skip
    kernel_preds = [set(), {0}, {0, 1}]
    assert unit_dependencies(units, kernel_preds) == [set(), {0}, {1}, {1, 2}, {3}]
