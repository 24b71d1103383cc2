"""The one timing loop: every latency kernorch reports or optimizes against is measured here.

Each call is timed on its own (`time.perf_counter`), after warm-up calls that are not kept. A fixed
number of runs, or an adaptive count: at least `min_runs`, more while the time spent stays within
`budget_seconds`, at most `max_runs`. Callers pick the statistic from the samples: the median for
latencies and kernel costs, the best run for a machine's peak (bandwidth, flops).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Timing:
    samples: tuple[float, ...]  # seconds per call, in the order measured

    @property
    def runs(self) -> int:
        return len(self.samples)

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def best(self) -> float:
        return min(self.samples)

    @property
    def worst(self) -> float:
        return max(self.samples)

    @property
    def spread(self) -> float:
        """Relative spread between repeats: (upper quartile − lower quartile) / median."""
        if len(self.samples) < 4:
            return (self.worst - self.best) / self.median if self.median > 0 else 0.0
        q1, _, q3 = statistics.quantiles(self.samples, n=4)
        return (q3 - q1) / self.median if self.median > 0 else 0.0


def time_call(function: Callable[[], Any], runs: int | None = None, warmup: int = 1, min_runs: int = 3,
              max_runs: int = 25, budget_seconds: float = 0.02) -> Timing:  # fmt: skip
    """Time `function()`; `runs` fixes the count, otherwise it adapts to `budget_seconds`."""
    if runs is not None and runs < 1:
        raise ValueError(f"runs must be at least 1, got {runs}")
    for _ in range(warmup):
        function()
    samples: list[float] = []
    spent = 0.0
    while True:
        if runs is not None:
            if len(samples) >= runs:
                break
        elif len(samples) >= min_runs and (spent >= budget_seconds or len(samples) >= max_runs):
            break
        start = time.perf_counter()
        function()
        elapsed = time.perf_counter() - start
        samples.append(elapsed)
        spent += elapsed
    return Timing(tuple(samples))
