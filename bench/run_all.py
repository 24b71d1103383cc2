"""`make bench`: run `kernorch bench` over a directory of models; write a dated markdown table and a PNG
chart of speedups over the best peer (onnxruntime) under bench/results/."""

from __future__ import annotations

import argparse
import datetime
import json
import math
import sys
from pathlib import Path

from kernorch.tools.bench import KERNORCH, PEERS, bench_model


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", default=str(Path(__file__).resolve().parents[2] / "shared" / "models"),
                        help="directory of .onnx models (default ../shared/models)")  # fmt: skip
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = parser.parse_args()
    models = sorted(Path(args.models).glob("*.onnx"))
    if not models:
        print(f"no .onnx models in {args.models}", file=sys.stderr)
        return 2
    reports = []
    for path in models:
        print(f"benchmarking {path.name} ...", file=sys.stderr, flush=True)
        reports.append(bench_model(str(path), runs=args.runs, threads=args.threads))
    stamp = datetime.date.today().isoformat()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stamp}.json").write_text(json.dumps(reports, indent=1))
    geomean = math.exp(sum(math.log(r["speedup_vs_best_peer"]) for r in reports) / len(reports))
    names = [*PEERS, *KERNORCH]
    lines = [
        f"# kernorch benchmark, {stamp}",
        "",
        f"{args.threads} threads, {reports[0]['runs']} runs per contender, each contender in its own process, "
        "rounds interleaved; medians in ms. Speedup = best peer median / kernorch median "
        "(best peer: the faster onnxruntime configuration).",
        "",
        "| model | " + " | ".join(names) + " | kernorch speedup vs best peer | kernels (opt/norewrite/greedy/unfused) "
        "| roofline bound ms | kernorch / bound |",
        "|---|" + "---|" * (len(names) + 4),
    ]
    for r in reports:
        medians = " | ".join(f"{r['contenders'][n]['median_ms']:.2f}" for n in names)
        kernels = "/".join(str(r["kernels"][n]) for n in KERNORCH)
        lines.append(f"| {r['model']} | {medians} | {r['speedup_vs_best_peer']:.2f}x | {kernels} | "
                     f"{r['roofline']['bound_ms']:.2f} | {r['roofline']['kernorch_over_bound']:.1f}x |")  # fmt: skip
    lines += ["", f"Geometric mean speedup of kernorch over the best peer: **{geomean:.2f}x**", ""]
    (out / f"{stamp}.md").write_text("\n".join(lines))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        figure, axis = plt.subplots(figsize=(11, 4.5))
        width = 0.8 / len(KERNORCH)
        for k, name in enumerate(KERNORCH):
            values = [r["speedups"][name] for r in reports]
            offset = (k - (len(KERNORCH) - 1) / 2) * width
            axis.bar([i + offset for i in range(len(reports))], values, width, label=name)
        axis.axhline(1.0, color="black", linewidth=0.8)
        axis.set_xticks(range(len(reports)), [r["model"].removesuffix(".onnx") for r in reports], rotation=30)
        axis.set_ylabel("speedup vs best onnxruntime")
        axis.set_title(f"kernorch vs onnxruntime ({stamp}, {args.threads} threads); geomean {geomean:.2f}x")
        axis.legend()
        figure.tight_layout()
        figure.savefig(out / f"{stamp}.png", dpi=110)
    except ImportError:
        print("matplotlib not installed: no chart (pip install 'kernorch[bench]')", file=sys.stderr)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
