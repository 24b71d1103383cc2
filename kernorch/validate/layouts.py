"""The layout decision checked end to end: the 0-1 program's assignment or channels-last everywhere.

With layout "auto" both assignments are orchestrated (pipeline.plan_graph) and the cheaper plan by its
predicted cost was kept. A prediction is a sum of kernels timed one at a time, and a layout's kernels differ
from the other's wholesale (channels-last panel convolutions against oneDNN's NCHW ones and the transposes
between), so one error repeated over a backend's kernels moves a whole layout: on a shared VM whose speed swings
1.2-2x for seconds, ResNeXt-50's channels-last panel convolutions were stored 1.2-1.9x their time (one tuning
pass in a slow minute), its channels-last plan was predicted 1.8 % dearer than the assignment's and ran 4.6 %
faster (ConvNeXt-V2: 6.3 %). So where the two predictions are within `BAND` of each other, both plans are
compiled and timed interleaved in this process (plans.measure_plans) and the faster kept, the cheaper by
prediction unless the other is faster by more than plans.MARGIN. A plan computing other outputs is never kept.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from kernorch.orchestrate import OrchestrationResult
from kernorch.validate.plans import MARGIN, measure_plans

BAND = 1.25  # the dearer layout's plan is timed when predicted within this factor of the cheaper one


@dataclass(frozen=True)
class Timing:
    """How to time plans here (None where plans are not timed: no measuring cost model, or a GPU's plans)."""

    threads: int
    cache_dir: Path | None = None
    runtime: str = "kernels"


def choose_layout(assignment: OrchestrationResult, channels_last: OrchestrationResult,
                  timing: Timing | None) -> OrchestrationResult:  # fmt: skip
    """The kept one of the two orchestrations, its layout report saying which and why."""
    cheaper, dearer = sorted((assignment, channels_last), key=lambda r: r.plan.cost)
    chosen, other = cheaper, dearer
    measured = ""
    if timing is not None and dearer.plan.cost <= cheaper.plan.cost * BAND:
        first, second = measure_plans([cheaper.plan, dearer.plan], timing.threads, timing.cache_dir, timing.runtime)
        assert first is not None  # the first plan is the outputs' reference
        if second is None:
            measured = f"; measured {_ms(first)}, the other's outputs differ"
        else:
            if second < first * (1 - MARGIN):
                chosen, other, first, second = dearer, cheaper, second, first
            measured = f"; measured {_ms(first)} vs {_ms(second)}"
    verdict = "channels-last everywhere" if chosen is channels_last else "the 0-1 program's assignment"
    chosen.layout_report = replace(chosen.layout_report, policy="auto",
                                   note=f"{verdict}: plan {chosen.plan.cost * 1e3:.3f} ms vs "
                                   f"{other.plan.cost * 1e3:.3f} ms predicted{measured}")  # fmt: skip
    return chosen


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms"
