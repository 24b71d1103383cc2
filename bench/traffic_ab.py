"""A/B of the activation-traffic pricing (cost/traffic.py): one model planned twice, its profiled kernels priced
isolated and priced with their activations' traffic, both plans compiled from the same code and alternated in
one process (whole inferences, `--rounds` of 5 each), so the machine's drift falls on both alike.

    python bench/traffic_ab.py MODEL.onnx [--rounds 20] [--threads 2]

Prints one markdown row: ms per inference (kernels) of each plan and the ratio traffic / isolated.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from kernorch.options import Options
from kernorch.pipeline import compile_plan, import_graph, make_cost_model, plan_graph
from kernorch.runtime.feeds import graph_feeds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    options = Options(threads=args.threads, cost="profile")
    plans = []
    for traffic in (False, True):
        cost = make_cost_model(options)
        if not traffic:
            cost.traffic = None  # type: ignore[attr-defined]  # a profiled cost model
        result = plan_graph(import_graph(args.model, None, options.strict), options, cost_model=cost)
        plans.append(compile_plan(result, options))
    feeds = graph_feeds(plans[0].graph)
    seconds: list[list[float]] = [[], []]
    for r in range(args.rounds):
        for i in (0, 1) if r % 2 == 0 else (1, 0):  # alternated, each order as often
            plans[i].run(feeds)
            plans[i].run(feeds)
            for _ in range(5):
                started = time.perf_counter()
                plans[i].run(feeds)
                seconds[i].append(time.perf_counter() - started)
    isolated, traffic = (statistics.median(s) * 1e3 for s in seconds)
    print(f"| {Path(args.model).stem} | {isolated:.2f} ({len(plans[0].kernels)}) | {traffic:.2f} "
          f"({len(plans[1].kernels)}) | {traffic / isolated:.3f} |")  # fmt: skip


if __name__ == "__main__":
    main()
