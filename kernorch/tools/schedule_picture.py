"""The rProgram of a plan, measured: a Gantt chart (vEU × time from the runtime's own timestamps, one colour per
kernel) and a summary of what ran side by side (`kernorch explain MODEL --schedule OUT.png`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kernorch.codegen.backends import Backend
from kernorch.errors import KernorchError
from kernorch.runtime.executor import PlanExecutor
from kernorch.runtime.timing import time_call
from kernorch.schedule.simulate import simulate

RUNS = 20
BACKEND_COLOURS = {"generated C": "Oranges", "native C": "Purples", "library call": "Blues", "reference": "Greys"}


@dataclass(frozen=True)
class ScheduleReport:
    kernels_ms: float  # the plan kernel by kernel (median)
    rprogram_ms: float  # the same plan as its rProgram (median)
    predicted_ms: float  # the simulator's prediction for the rProgram
    program: str  # RProgram.describe()
    spans: list[tuple[int, int, float, float]]  # per rTask of the median traced run: (kernel, vEU or -1, start, end)
    overlapped_ms: float  # time in which two or more vEUs ran rTasks of different kernels
    pairs: list[tuple[int, int, float]]  # kernels that overlapped longest: (kernel a, kernel b, ms)

    def summary(self) -> list[str]:
        lines = [f"rProgram: {self.program}",
                 f"kernel by kernel {self.kernels_ms:.3f} ms, rProgram {self.rprogram_ms:.3f} ms "
                 f"({self.kernels_ms / self.rprogram_ms:.2f}x); simulator predicted {self.predicted_ms:.3f} ms "
                 f"({self.predicted_ms / self.rprogram_ms - 1:+.0%})",
                 f"different kernels side by side for {self.overlapped_ms:.3f} ms of the measured run"]  # fmt: skip
        lines += [f"  kernel {a} beside kernel {b}: {ms * 1e3:.1f} us" for a, b, ms in self.pairs]
        return lines


def _median_ms(executor: PlanExecutor, runtime: str, feeds: Mapping[str, np.ndarray]) -> float:
    executor.runtime = runtime
    return time_call(lambda: executor(feeds), runs=RUNS).median * 1e3


def measure_schedule(executor: PlanExecutor, feeds: Mapping[str, np.ndarray]) -> ScheduleReport:
    runner = executor.build_rprogram(feeds)
    program = runner.program
    assert program is not None
    kernels_ms = _median_ms(executor, "kernels", feeds)
    rprogram_ms = _median_ms(executor, "rprogram", feeds)
    traces = []
    for _ in range(5):
        spans = runner.traced()
        traces.append((max(end for _, _, end in spans), spans))
    _, spans = sorted(traces, key=lambda item: item[0])[len(traces) // 2]
    by_task = [(program.units[t.unit].kernel, veu, start, end)
               for t, (veu, start, end) in zip(runner.tasks, spans, strict=True)]  # fmt: skip
    overlapped, pairs = _overlaps(by_task)
    pairs_ms = [(a, b, seconds * 1e3) for a, b, seconds in pairs]
    return ScheduleReport(kernels_ms, rprogram_ms, simulate(program, runner.times).seconds * 1e3, program.describe(),
                          by_task, overlapped * 1e3, pairs_ms)  # fmt: skip


def _overlaps(spans: list[tuple[int, int, float, float]]) -> tuple[float, list[tuple[int, int, float]]]:
    """Seconds during which rTasks of different kernels ran at once, and the kernel pairs that did so longest."""
    in_regions = [s for s in spans if s[1] >= 0]
    together: dict[tuple[int, int], float] = {}
    events = sorted({t for _, _, start, end in in_regions for t in (start, end)})
    total = 0.0
    for left, right in zip(events, events[1:], strict=False):
        running = {k for k, _, start, end in in_regions if start <= left and end >= right}
        if len(running) >= 2:
            total += right - left
            for a in running:
                for b in running:
                    if a < b:
                        together[(a, b)] = together.get((a, b), 0.0) + right - left
    pairs = sorted(((a, b, s) for (a, b), s in together.items()), key=lambda p: -p[2])[:5]
    return total, pairs


def draw_schedule(path: str | Path, report: ScheduleReport, backends: list[Backend], veus: int, title: str) -> Path:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as error:
        raise KernorchError(f"drawing the schedule needs matplotlib: pip install 'kernorch[pictures]' ({error})") \
            from None
    target = Path(path)
    figure, axes = plt.subplots(figsize=(14, 1.2 + 0.9 * (veus + 1)))
    maps = {name: plt.get_cmap(cmap) for name, cmap in BACKEND_COLOURS.items()}
    for kernel, veu, start, end in report.spans:
        colour = maps.get(backends[kernel].family, maps["reference"])(0.35 + 0.5 * ((kernel * 0.618) % 1.0))
        rows = range(veus) if veu < 0 else [veu]  # a device-wide call occupies every vEU
        for row in rows:
            axes.broken_barh([(start * 1e3, (end - start) * 1e3)], (row - 0.4, 0.8), facecolors=colour,
                             edgecolors="black" if veu < 0 else "none", linewidth=0.3)  # fmt: skip
    axes.set_yticks(range(veus), [f"vEU {v}" for v in range(veus)])
    axes.invert_yaxis()
    axes.set_xlabel("ms since the inference started (measured)")
    axes.set_title(f"{title}: rProgram {report.rprogram_ms:.2f} ms vs kernel by kernel {report.kernels_ms:.2f} ms "
                   "(orange: generated C, blue: library, grey: Python; outlined: device-wide call)", fontsize=9)
    figure.tight_layout()
    target.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(target, dpi=110)
    plt.close(figure)
    return target
