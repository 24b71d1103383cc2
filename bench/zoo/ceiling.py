"""How far any plan could beat the best peer on this machine: each model of a zoo run held against its roofline floor.

    .venv/bin/python bench/zoo/ceiling.py RESULTS.json ZOO_DIR [--precision fp32|bf16] [--probes 5]
                                          [--out bench/results/DATE-ceiling.md]

The floor of a model is the larger of its compute floor — its products' flops at the instruction peak of this
host's vector units (bench/peak/vector_peak.c: float32 FMA, or AVX512-BF16's vdpbf16ps in bf16; the best of
`--probes` runs with the bench's two threads, an upper bound no kernel passes) — and its memory floor (inputs,
weights and outputs moved once at the calibrated bandwidth: kernorch.tools.bench.roofline_bound). No plan, whoever
computes it by direct (GEMM-form) arithmetic, runs faster here; so the best peer's median in RESULTS.json (a
`bench/zoo/run.py` table's JSON, measured on the same kind of CPU) over the floor is the most such a plan could beat
it by: the ceiling of the ratio the issue asks for. A fast algorithm multiplies less: Winograd's F(4x4, 3x3) a
quarter of a 3x3 stride-1 convolution's products (kernorch's Winograd kernel is F(2x2, 3x3), float32), so a second
ceiling holds those convolutions at a quarter of their flops, transforms free. The peers' medians come from the
results as they are; only the floors are computed here.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import tempfile
from pathlib import Path

from kernorch.cost.analytic import primitive_flops
from kernorch.ir.graph import Graph
from kernorch.machine import bf16_supported, cpu_family_model, cpu_model, isa_flags
from kernorch.options import Options
from kernorch.pipeline import import_graph
from kernorch.tools.bench import roofline_bound

PROBE = Path(__file__).resolve().parents[1] / "peak" / "vector_peak.c"


def instruction_peaks(probes: int, threads: int) -> dict[str, float]:
    """flop/s of each instruction vector_peak.c measures, the best of `probes` runs with `threads` threads."""
    with tempfile.TemporaryDirectory() as work:
        binary = Path(work) / "vector_peak"
        subprocess.run(["gcc", "-O2", "-march=native", "-fopenmp", str(PROBE), "-o", str(binary)], check=True)
        peaks: dict[str, float] = {}
        for _ in range(probes):
            out = subprocess.run([str(binary)], check=False, capture_output=True, text=True,
                                 env={**os.environ, "OMP_NUM_THREADS": str(threads)}).stdout  # fmt: skip
            for line in out.splitlines():
                name, _, _, gflops = line.split()
                peaks[name] = max(peaks.get(name, 0.0), float(gflops) * 1e9)
    return peaks


def winograd_flops(graph: Graph) -> float:
    """The flops of the graph's 3x3 stride-1 undilated convolutions without groups: what Winograd can take."""
    return sum(primitive_flops(graph, node) for node in graph.nodes if node.prim == "conv"
               and graph.types[node.inputs[1]].shape[2:] == (3, 3) and node.attr("group", 1) == 1
               and tuple(node.attr("strides", (1, 1))) == (1, 1)
               and tuple(node.attr("dilations", (1, 1))) == (1, 1))  # fmt: skip


def cpu_name() -> str:
    """The CPU as the results name it: its model name, family and model, and which of the bf16 and int8 instruction
    sets it has."""
    flags = set(isa_flags())
    extensions = [name for name in ("avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16") if name in flags]
    return f"{cpu_model()} ({cpu_family_model()}; {', '.join(extensions) or 'no AVX-512'})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", type=Path, help="a bench/zoo/run.py JSON (its rows' best peer medians)")
    parser.add_argument("zoo", type=Path, help="the folder holding the results' models")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--probes", type=int, default=5, help="runs of the peak probe; the best is kept")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, help="write the table here as well")
    args = parser.parse_args()
    bf16 = args.precision == "bf16" and bf16_supported()
    peaks = instruction_peaks(args.probes, args.threads)
    instruction = "bf16-dp" if bf16 else "fp32-fma"
    if instruction not in peaks:
        print(f"ceiling.py: the probe measured no {instruction} here (compiled without it)")
        return 2
    rate = peaks[instruction]
    options = Options(threads=args.threads, precision=args.precision)
    rows = json.loads(args.results.read_text())
    lines = [f"CPU: {cpu_name()}, {args.threads} threads; {instruction} peak {rate / 1e9:.0f} GFLOP/s "
             f"(fp32 FMA {peaks['fp32-fma'] / 1e9:.0f}); peers from {args.results}", "",
             "| model | GFLOP | 3x3 stride-1 share | compute floor ms | memory floor ms | best peer ms | ceiling | "
             "ceiling, 3x3 by Winograd | kernorch ratio |", "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    ceilings, winograd_ceilings, ratios = [], [], []
    for name, row in rows.items():
        if "best_peer_ms" not in row:
            continue
        graph = import_graph(str(args.zoo / f"{name}.onnx"), None, strict=False)
        roof = roofline_bound(graph, options, float_rate=rate)
        ceiling = row["best_peer_ms"] / roof["floor_ms"]
        flops = roof["flops"]
        share = winograd_flops(graph) / flops
        winograd_floor = max(roof["compute_floor_ms"] * (1 - 0.75 * share), roof["memory_floor_ms"])
        ceilings.append(ceiling)
        winograd_ceilings.append(row["best_peer_ms"] / winograd_floor)
        ratios.append(row["ratio"])
        lines.append(f"| {name} | {flops / 1e9:.2f} | {share:.0%} | {roof['compute_floor_ms']:.2f} | "
                     f"{roof['memory_floor_ms']:.2f} | {row['best_peer_ms']:.2f} ({row['best_peer']}) | "
                     f"{ceiling:.2f}x | {winograd_ceilings[-1]:.2f}x | {row['ratio']:.2f}x |")  # fmt: skip
        print(lines[-1], flush=True)

    def geomean(values: list[float]) -> float:
        return math.exp(sum(math.log(v) for v in values) / len(values))

    lines += ["", f"Geometric means over {len(ceilings)}: ceiling {geomean(ceilings):.2f}x "
              f"({geomean(winograd_ceilings):.2f}x with Winograd), kernorch {geomean(ratios):.2f}x; models whose "
              "ceiling is below 1.3x: "
              f"{sum(c < 1.3 for c in ceilings)} ({sum(c < 1.3 for c in winograd_ceilings)} with Winograd)."]
    print("\n".join(lines[-2:]))
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
