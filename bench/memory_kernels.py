"""The slowest generated memory-bound kernels of saved plans, measured in place, against their roofline.

    python bench/memory_kernels.py PLAN_DIR [PLAN_DIR ...] [--top 20] [--repeats 20] [--json OUT.json]

A PLAN_DIR is what `kernorch optimize MODEL -o PLAN_DIR` saved. Prints the measured bandwidth of each memory
level, then per plan a markdown table: kernel, primitives, µs, MB moved, the level its working set fits in,
achieved GB/s, roofline µs (bytes at that level's bandwidth + one dispatch) and the ratio measured / roofline,
then how many kernels over 20 µs are beyond 1.5x their roofline. Measure on a quiet machine.
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
from kernorch.tools.kernel_roofline import memory_kernels, summary, table


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
    report = {}
    for directory in args.plans:
        try:
            model = kernorch.load(directory, threads=args.threads)
        except kernorch.ArtifactError as error:
            print(f"{directory}: {error}", file=sys.stderr)
            return 2
        executor = model.executor
        rows = memory_kernels(executor, graph_feeds(executor.graph), levels, args.repeats)
        print(f"\n## {Path(directory).name}\n")
        print("\n".join(table(rows, args.top)))
        print(f"\n{summary(rows)}")
        report[Path(directory).name] = [asdict(r) | {"ratio": r.ratio, "gbs": r.gbs} for r in rows]
    if args.json:
        Path(args.json).write_text(json.dumps({"levels": [asdict(lv) for lv in levels.levels],
                                               "dispatch": levels.dispatch, "plans": report}, indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
