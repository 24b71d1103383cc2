"""The count of shape sets served without a plan: hot ones handed to the planner once, the count bounded."""

from __future__ import annotations

from kernorch.devtools.mutate import here
from kernorch.frontend import ShapeSet
from kernorch.shapes.serving import HOT_CALLS, HotShapes


def _shapes(length: int) -> ShapeSet:
    return (("ids", (1, length)),)


def test_a_shape_set_turns_hot_once_and_the_count_stays_bounded() -> None:
    """A generation's lengths, each called once, never plan and keep only the most recent counted; a set called
    HOT_CALLS times is planned once; one evicted before it turned hot starts counting again."""
    planned: list[ShapeSet] = []
    hot = HotShapes(planned.append, max_counted=4)
    for length in range(1, 11):
        hot.called(_shapes(length))
    assert list(hot.served) == [_shapes(n) for n in (7, 8, 9, 10)] and hot.totals == (10, 10)
    for _ in range(HOT_CALLS + 2):
        hot.called(_shapes(9))
    assert hot.wait(timeout=10) and planned == [_shapes(9)]
    assert hot.served[_shapes(9)] == HOT_CALLS + 3 and list(hot.served)[-1] == _shapes(9)  # the most recent last
    for _ in range(HOT_CALLS - 1):
        hot.called(_shapes(1))  # evicted after one call: two more do not make it hot
    assert hot.served[_shapes(1)] == HOT_CALLS - 1 and planned == [_shapes(9)] and len(hot.served) == 4
    assert hot.totals == (11, 10 + HOT_CALLS + 2 + HOT_CALLS - 1)


def test_an_empty_tensors_shape_set_is_counted_but_never_planned() -> None:
    planned: list[ShapeSet] = []
    hot = HotShapes(planned.append)
    for _ in range(HOT_CALLS * 2):
        hot.called(_shapes(0), plannable=False)
    assert hot.wait(timeout=1) and planned == [] and hot.served == {_shapes(0): HOT_CALLS * 2}


# The mutants of the code this file tests, each a one-line change a real bug could make and that these tests must
# catch (`make mutate`: kernorch/devtools/mutate.py collects them)
MUTANTS = [
    here("hot shapes: the count grows without bound",
         "            if len(self._calls) > self._max_counted:",
         "            if False:", file="kernorch/shapes/serving.py"),
    here("hot shapes: eviction drops the most recently called set",
         "            self._calls.move_to_end(shapes)",
         "            pass", file="kernorch/shapes/serving.py"),
]  # fmt: skip
