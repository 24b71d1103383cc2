"""One zoo run (`make zoo`'s JSON) summarised per model family: how many models, the geometric mean of kernorch's
ratio to the best peer, the lowest and highest, and a plot of every model's ratio. What README's Performance
table is written from.

    .venv/bin/python bench/zoo_summary.py bench/results/DATE-zoo.json [--plot bench/results/DATE-zoo.png]

Prints the table as Markdown. A model that did not pass `check --compiled` or was not timed is counted apart.
"""

from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any


def geometric_mean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def timed(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The models with a ratio (passed and timed)."""
    return {name: r for name, r in results.items() if isinstance(r.get("ratio"), int | float) and r["ratio"] > 0}


def family_table(results: dict[str, Any]) -> list[str]:
    ratios = timed(results)
    families: dict[str, list[tuple[float, str]]] = defaultdict(list)
    for name, result in ratios.items():
        families[result.get("family", "?")].append((result["ratio"], name))
    lines = ["| family | models | geometric mean | lowest | highest |", "|---|---|---|---|---|"]
    for family, members in sorted(families.items()):
        low, high = min(members), max(members)
        lines.append(f"| {family} | {len(members)} | {geometric_mean([r for r, _ in members]):.2f}x | "
                     f"{low[0]:.2f}x ({low[1]}) | {high[0]:.2f}x ({high[1]}) |")  # fmt: skip
    every = [r["ratio"] for r in ratios.values()]
    lines.append(f"| **all** | {len(every)} | **{geometric_mean(every):.2f}x** | {min(every):.2f}x | "
                 f"{max(every):.2f}x |")  # fmt: skip
    untimed = sorted(set(results) - set(ratios))
    if untimed:
        lines.append(f"\nNot timed: {', '.join(untimed)}")
    return lines


def plot(results: dict[str, Any], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ratios = sorted(timed(results).items(), key=lambda item: item[1]["ratio"])
    families = sorted({r.get("family", "?") for _, r in ratios})
    colours = {f: plt.get_cmap("tab10")(i % 10) for i, f in enumerate(families)}
    figure, axes = plt.subplots(figsize=(12, 4.5))
    axes.bar(range(len(ratios)), [r["ratio"] for _, r in ratios],
             color=[colours[r.get("family", "?")] for _, r in ratios])  # fmt: skip
    axes.axhline(1.0, color="black", linewidth=0.8)
    axes.axhline(1.3, color="grey", linewidth=0.8, linestyle="--")
    axes.set_xticks(range(len(ratios)), [name for name, _ in ratios], rotation=90, fontsize=7)
    axes.set_ylabel("kernorch speed / best peer's")
    axes.set_title(title)
    axes.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=colours[f]) for f in families], labels=families,
                fontsize=8, loc="upper left")  # fmt: skip
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", type=Path, help="a zoo run's JSON (bench/results/*-zoo*.json)")
    parser.add_argument("--plot", type=Path, help="write a bar chart of every model's ratio here (PNG)")
    parser.add_argument("--title", default="", help="the plot's title (the run: date, CPU, precision)")
    args = parser.parse_args()
    results = json.loads(args.results.read_text())
    print("\n".join(family_table(results)))
    if args.plot:
        plot(results, args.plot, args.title or args.results.stem)
        print(f"\nplot: {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
