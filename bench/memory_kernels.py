"""The slowest generated memory-bound kernels of saved plans, hot and in place, against their roofline.

    python bench/memory_kernels.py PLAN_DIR [PLAN_DIR ...] [--top 20] [--repeats 20] [--json OUT.json]

A PLAN_DIR is what `kernorch optimize MODEL -o PLAN_DIR` saved. Prints the measured bandwidth of each memory
level and the measured cost of exp/sigmoid/tanh/erf, then per plan a markdown table, slowest (hot) first: kernel,
primitives, µs hot (repeated on its own, its data where its working set fits, as the roofline assumes) and
in place (inside whole inferences), MB moved, the level its working set fits in, achieved GB/s, roofline µs
(bytes at that level's bandwidth + one dispatch) and the ratio hot / roofline, and the math floor (a dispatch
and its exp/sigmoid/tanh/erf evaluations at their cost in a generated `y = f(x)`) with the ratios hot and in
place to the higher of the two floors, and the GIR performance model's time for the kernel as generated (which
counts the passes it makes, where the roofline counts each byte once) with the ratio hot / model; then how many
kernels over 20 µs are beyond 1.5x their roofline and beyond 1.5x the higher floor. Measure on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

import kernorch
from kernorch.cost.bandwidth import measure_levels
from kernorch.runtime.feeds import graph_feeds
from kernorch.tools.kernel_roofline import math_seconds, memory_kernels, summary, table


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("plans", nargs="+", help="plan directories saved by `kernorch optimize`")
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=20, help="inferences each kernel is timed over")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", help="also write every kernel's row here")
    args = parser.parse_args()
    levels = measure_levels(threads=args.threads)
    print("measured bandwidth: " + ", ".join(f"{lv.name} {lv.bandwidth / 1e9:.1f} GB/s" for lv in levels.levels)
          + f"; dispatch {levels.dispatch * 1e6:.2f} µs")  # fmt: skip
    math = math_seconds(args.threads)
    print("measured math (generated y = f(x) in L2, all threads): "
          + ", ".join(f"{name} {seconds * 1e9:.3f} ns/element" for name, seconds in math.items()))  # fmt: skip
    report = {}
    for directory in args.plans:
        try:
            model = kernorch.load(directory, threads=args.threads)
        except kernorch.ArtifactError as error:
            print(f"{directory}: {error}", file=sys.stderr)
            return 2
        executor = model.executor
        rows = memory_kernels(executor, graph_feeds(executor.graph), levels, args.repeats, math)
        print(f"\n## {Path(directory).name}\n")
        print("\n".join(table(rows, args.top)))
        print(f"\n{summary(rows)}")
        report[Path(directory).name] = [asdict(r) | {"ratio": r.ratio, "gbs": r.gbs, "floor_ratio": r.floor_ratio,
                                                     "in_plan_ratio": r.in_plan_ratio, "model_ratio": r.model_ratio}
                                    for r in rows]  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps({"levels": [asdict(lv) for lv in levels.levels], "math": math,
                                               "dispatch": levels.dispatch, "plans": report}, indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
