"""How well the GIR performance model ranks generated kernels, against the measured profiles.

    python bench/perf_model.py MODEL.onnx [MODEL.onnx ...] [--threads 2]

Orchestrates each model with the profiling cost model (its measurements come from the profile database, so
run `kernorch optimize` first; whatever is missing is measured) and records, for every candidate kernel the C
backend generates, its measured time, the GIR model's estimate and the plain roofline's (bytes at the DRAM
bandwidth, flops at peak: `--cost analytic`). Prints Spearman's rank correlation of each model with the
measurements, per model and over all candidates, and the estimate's median ratio to the measurement.

Then what the GIR screen (`GirScreen`, on by default in `optimize`) would leave out of profiling: how many
candidates, how many of them the unscreened optimal plan chose (should be 0), and how many were in fact
faster fused than their primitives measured one by one (the screen's misjudgements).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

from kernorch.codegen.backends import GENERATED_C, choose_backend
from kernorch.cost.analytic import AnalyticCostModel, calibrate_this_machine
from kernorch.cost.bandwidth import measure_levels
from kernorch.cost.gir_model import GirScreen, estimate, kernel_gir, spearman
from kernorch.cost.interface import CostModelBase
from kernorch.ir.kernel import CandidateKernel
from kernorch.options import Options
from kernorch.pipeline import import_graph, make_cost_model, plan_graph


class Recording(CostModelBase):
    """The profiling cost model, noting (measured, GIR estimate, roofline) for every generated candidate."""

    def __init__(self, base: Any, levels: Any, roofline: AnalyticCostModel, threads: int) -> None:
        self.base, self.levels, self.roofline, self.threads = base, levels, roofline, threads
        self.rows: dict[tuple[int, Any], tuple[float, float, float]] = {}
        self.kernels: dict[tuple[int, Any], CandidateKernel] = {}
        self.alone: dict[tuple[int, int], float] = {}  # (graph, node) -> measured seconds of the node by itself

    @property
    def name(self) -> str:
        return str(self.base.name)

    def prepare(self, kernels: list[CandidateKernel]) -> None:
        self.base.prepare(kernels)

    def rejection(self, kernel: CandidateKernel) -> str | None:
        return self.base.rejection(kernel)  # type: ignore[no-any-return]

    def cost(self, kernel: CandidateKernel) -> float:
        measured = float(self.base.cost(kernel))
        key = (id(kernel.graph), kernel.key)
        if len(kernel.nodes) == 1 and math.isfinite(measured):
            self.alone[(id(kernel.graph), kernel.nodes[0])] = measured
        self.kernels[key] = kernel
        if key not in self.rows and math.isfinite(measured) and choose_backend(kernel)[0] is GENERATED_C:
            gir = kernel_gir(kernel, self.threads)
            if gir is not None:
                self.rows[key] = (measured, estimate(gir, self.levels, self.threads),
                                  self.roofline.cost(kernel))  # fmt: skip
        return measured


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="+")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", help="write every (measured, gir, roofline) triple here")
    args = parser.parse_args()
    options = Options(threads=args.threads)
    levels = measure_levels(threads=args.threads)
    roofline = AnalyticCostModel(calibrate_this_machine(threads=args.threads))
    everything: list[tuple[float, float, float]] = []
    report = {}
    screen = GirScreen(lambda: levels, args.threads)
    screened: list[str] = []
    print("| model | generated candidates | Spearman GIR model | Spearman roofline | GIR / measured (median) |")
    print("|---|---|---|---|---|")
    for path in args.models:
        recording = Recording(make_cost_model(options), levels, roofline, args.threads)
        result = plan_graph(import_graph(path, None, False), options, cost_model=recording)
        left_out = [k for k in recording.kernels.values() if screen(k) is not None]
        chosen = sum(screen(k) is not None for k in result.plan.kernels)
        wrong = 0
        for k in left_out:
            parts = [recording.alone.get((id(k.graph), n)) for n in k.nodes]
            fused = recording.rows.get((id(k.graph), k.key))
            if fused is not None and all(p is not None for p in parts) and fused[0] < sum(parts):  # type: ignore[arg-type]
                wrong += 1
        screened.append(f"| {Path(path).stem} | {len(recording.kernels)} | {len(left_out)} | {chosen} | {wrong} |")
        rows = list(recording.rows.values())
        everything += rows
        measured, gir, roof = ([r[i] for r in rows] for i in range(3))
        ratio = statistics.median(g / m for g, m in zip(gir, measured, strict=True)) if rows else math.nan
        report[Path(path).stem] = rows
        print(f"| {Path(path).stem} | {len(rows)} | {spearman(gir, measured):.3f} | {spearman(roof, measured):.3f} "
              f"| {ratio:.2f} |")  # fmt: skip
    measured, gir, roof = ([r[i] for r in everything] for i in range(3))
    print(f"| all | {len(everything)} | {spearman(gir, measured):.3f} | {spearman(roof, measured):.3f} | |")
    print("\n| model | candidates | left out by the GIR screen | of them in the unscreened plan | "
          "of them faster fused than apart (measured) |")
    print("|---|---|---|---|---|")
    print("\n".join(screened))
    if args.json:
        Path(args.json).write_text(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
