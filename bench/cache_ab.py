"""Two plans of one model, each planned against its own profile cache, alternated in one process: which runs
faster end to end. For changes to how kernels are measured or priced: tune a fresh cache with the code before and
one with the code after (`KERNORCH_CACHE=DIR kernorch explain MODEL --cost profile`), then

    .venv/bin/python bench/cache_ab.py MODEL CACHE_A CACHE_B [--rounds 30] [--runs 5]

Each round runs A then B (B then A on odd rounds, so neither always follows the other): two untimed runs, then
`--runs` timed ones. Prints each plan's median and kernel count and B's median over A's. The same seeded inputs feed
both; on this noisy VM only a ratio from one process is worth reading.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import kernorch
from kernorch.runtime.feeds import graph_feeds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", type=Path)
    parser.add_argument("cache_a", type=Path)
    parser.add_argument("cache_b", type=Path)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    plans = [kernorch.compile(str(args.model), threads=args.threads, cost="profile", cache_dir=str(cache))
             for cache in (args.cache_a, args.cache_b)]  # fmt: skip
    feeds = graph_feeds(plans[0].graph)  # seeded: token ids inside the tables they index
    times: list[list[float]] = [[], []]
    for round_number in range(args.rounds):
        for which in (0, 1) if round_number % 2 == 0 else (1, 0):
            for _ in range(2):
                plans[which].run(feeds)
            for _ in range(args.runs):
                started = time.perf_counter()
                plans[which].run(feeds)
                times[which].append(time.perf_counter() - started)
    a, b = (statistics.median(t) * 1e3 for t in times)
    print(f"A {a:.2f} ms ({len(plans[0].kernels)} kernels)  B {b:.2f} ms ({len(plans[1].kernels)} kernels)  "
          f"B/A {b / a:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
