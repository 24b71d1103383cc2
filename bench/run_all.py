"""`make bench`: run `kernorch bench` over a directory of models; write a dated markdown table and a PNG
chart of speedups over the best peer (onnxruntime) under bench/results/."""

from __future__ import annotations

import argparse
import datetime
import json
import math
import sys
from pathlib import Path

from kernorch.options import Options
from kernorch.tools.bench import KERNORCH, LAYOUT_CONTENDERS, PEERS, bench_model


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", default=str(Path(__file__).resolve().parents[2] / "shared" / "models"),
                        help="directory of .onnx models (default ../shared/models)")  # fmt: skip
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    parser.add_argument("--resume", action="store_true",
                        help="keep the models already in today's JSON and benchmark only the others")
    parser.add_argument("--compare-layouts", action="store_true",
                        help="also time kernorch with every conv channels-last and with everything NCHW "
                        "(models with convolutions)")  # fmt: skip
    args = parser.parse_args()
    models = sorted(Path(args.models).glob("*.onnx"))
    if not models:
        print(f"no .onnx models in {args.models}", file=sys.stderr)
        return 2
    reports = []
    stamp = datetime.date.today().isoformat()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.resume and (out / f"{stamp}.json").is_file():
        reports = json.loads((out / f"{stamp}.json").read_text())
        done = {r["model"] for r in reports}
        models = [m for m in models if m.name not in done]
    for path in models:
        print(f"benchmarking {path.name} ...", file=sys.stderr, flush=True)
        reports.append(bench_model(str(path), runs=args.runs, options=Options(threads=args.threads),
                                   compare_layouts=args.compare_layouts))  # fmt: skip
        (out / f"{stamp}.json").write_text(json.dumps(reports, indent=1))  # kept as each model finishes
    geomean = math.exp(sum(math.log(r["speedup_vs_best_peer"]) for r in reports) / len(reports))
    names = [n for n in (*PEERS, *KERNORCH, *LAYOUT_CONTENDERS) if any(n in r["contenders"] for r in reports)]
    lines = [
        f"# kernorch benchmark, {stamp}",
        "",
        f"{args.threads} threads, {reports[0]['runs']} runs per contender, each contender in its own process, "
        "rounds interleaved; medians in ms. Speedup = best peer median / kernorch median "
        "(best peer: the faster of onnxruntime, all optimizations, and OpenVINO, fp32).",
        "",
        "| model | " + " | ".join(names) + " | best peer | kernorch speedup vs best peer "
        "| kernels (opt/norewrite/greedy/unfused) | roofline bound ms | kernorch / bound |",
        "|---|" + "---|" * (len(names) + 5),
    ]
    for r in reports:
        medians = " | ".join(f"{r['contenders'][n]['median_ms']:.2f}" if n in r["contenders"] else "-"
                             for n in names)  # fmt: skip
        kernels = "/".join(str(r["kernels"][n]) for n in KERNORCH)
        lines.append(f"| {r['model']} | {medians} | {r['best_peer']} | {r['speedup_vs_best_peer']:.2f}x | {kernels} | "
                     f"{r['roofline']['bound_ms']:.2f} | {r['roofline']['kernorch_over_bound']:.1f}x |")  # fmt: skip
    lines += ["", f"Geometric mean speedup of kernorch over the best peer: **{geomean:.2f}x**", ""]
    for r in reports:
        layouts = "; ".join(f"{name}: {v['channels_last_convs']}/{v['convs']} convs channels-last, "
                            f"{v['transposes']} layout changes" + (f" ({v['note']})" if v.get("note") else "")
                            for name, v in r.get("layouts", {}).items())  # fmt: skip
        absorbed = "; ".join(f"{kind} ×{n}" for kind, n in r.get("epilogues", {}).items()) or "nothing"
        lines.append(f"- {r['model']}: {layouts or 'no convolutions'}. Library calls absorbed: {absorbed}.")
    lines.append("")
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
        axis.set_ylabel("speedup vs best peer")
        axis.set_title(f"kernorch vs best of onnxruntime/OpenVINO ({stamp}, {args.threads} threads); "
                       f"geomean {geomean:.2f}x")
        axis.legend()
        figure.tight_layout()
        figure.savefig(out / f"{stamp}.png", dpi=110)
    except ImportError:
        print("matplotlib not installed: no chart (pip install 'kernorch[bench]')", file=sys.stderr)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
