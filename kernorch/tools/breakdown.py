"""Where a compiled plan's time goes (`kernorch bench --breakdown`): each kernel timed in place, summed by kind.

Kinds: linear kernels (library calls: oneDNN or kernorch's own convolutions, float32 or bf16) against the
machine's measured float32 peak and, each, against its roofline (`roofline`: a product over a few rows is bound
by streaming its weights, not by the peak), generated kernels (memory-bound C) against its measured bandwidth, layout
changes (kernels of layout primitives only: transposes, pads, concats that copy), kernels run by Python (the
reference or onnxruntime), and the runtime's own overhead: the end-to-end median minus the kernels' sum
(dispatch between kernels, feeding inputs, copying outputs). Kernel times come from whole inferences with
every kernel timed on its own (`PlanExecutor.kernel_times`), so each kernel's data is where the kernels before
it left it. The next gap is the largest row, read against its floor.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from kernorch.codegen.backends import Backend
from kernorch.codegen.library import absorbed_summary
from kernorch.cost.analytic import BF16_RATE, calibrate_this_machine, int8_rate, kernel_bytes, primitive_flops
from kernorch.ir.kernel import CandidateKernel
from kernorch.ir.primitives import PRIMITIVES, Kind
from kernorch.runtime.timing import time_call

LISTED = 8  # linear kernels printed one by one (the report holds them all)


@dataclass
class Row:
    kind: str
    kernels: int = 0
    seconds: float = 0.0
    flops: float = 0.0  # linear kinds
    bytes: float = 0.0  # memory-bound kinds
    roof_seconds: float = 0.0  # linear kinds: each kernel's time at its roofline, summed

    def to_json(self) -> dict[str, Any]:
        return dict(vars(self))


def kind_of(kernel: CandidateKernel, backend: Backend) -> str:
    """The row a kernel's time goes to, given the backend the executor runs it with."""
    kinds = {PRIMITIVES[n.prim].kind for n in kernel.primitives}
    if not backend.runs_code:
        return "views (no code)"
    if not backend.native:
        return "run by Python (reference / onnxruntime)"
    if Kind.LINEAR in kinds:
        if any(n.prim in ("matmul_integer", "conv_integer") for n in kernel.primitives):
            return f"linear, int8 ({backend.family})"
        bf16 = any(n.attr("precision") == "bf16" for n in kernel.primitives)
        return f"linear, {'bf16' if bf16 else 'fp32'} ({backend.family})"
    if kinds == {Kind.LAYOUT}:
        return "layout changes (copies)"
    if Kind.OPAQUE in kinds:
        return "opaque (LSTM scans)"
    return "generated (memory-bound)"


def breakdown(compiled: Any, feeds: Mapping[str, np.ndarray], repeats: int = 20) -> dict[str, Any]:
    """The plan's time by kind of kernel, and the runtime overhead, measured here (see the module docstring)."""
    executor = compiled.executor
    times = executor.kernel_times(feeds, repeats)
    total = time_call(lambda: compiled.run(feeds), runs=repeats).median
    rows: dict[str, Row] = {}
    linear: list[dict[str, Any]] = []  # each linear kernel: what it is, its time and rate
    for index, (kernel, backend, seconds) in enumerate(zip(compiled.kernels, executor.backends, times, strict=True)):
        kind = kind_of(kernel, backend)
        row = rows.setdefault(kind, Row(kind))
        row.kernels += 1
        row.seconds += seconds
        if row.kind.startswith("linear"):
            flops = sum(primitive_flops(kernel.graph, n) for n in kernel.primitives
                        if PRIMITIVES[n.prim].kind == Kind.LINEAR)  # fmt: skip
            row.flops += flops
            linear.append({"kernel": index, "what": absorbed_summary(kernel) or row.kind, "ms": seconds * 1e3,
                           "gflops": flops / seconds / 1e9 if seconds else 0.0, "flops": flops,
                           "bytes": kernel_bytes(kernel), "kind": kind})  # fmt: skip
        else:
            row.bytes += kernel_bytes(kernel)
    # measured now, as the kernels were: a cached calibration may date from a busy moment
    device = calibrate_this_machine(compiled.cache_dir, compiled.threads, refresh=True)
    for entry in linear:
        entry["of_fp32_peak"] = entry["gflops"] * 1e9 / device.peak_flops
        rate = {"bf16": BF16_RATE, "int8": int8_rate()}.get(entry["kind"].split(" ")[1], 1.0)
        peak = device.peak_flops * rate
        entry.update(roofline(entry["flops"], entry["bytes"], entry["ms"] / 1e3, peak, device.stream_bandwidth))
        rows[entry["kind"]].roof_seconds += entry["of_roofline"] * entry["ms"] / 1e3
    return {"total_ms": total * 1e3, "kernels_ms": sum(times) * 1e3, "overhead_ms": (total - sum(times)) * 1e3,
            "peak_gflops": device.peak_flops / 1e9, "bandwidth_gbs": device.bandwidth / 1e9,
            "stream_gbs": device.stream_bandwidth / 1e9,
            "rows": [r.to_json() for r in sorted(rows.values(), key=lambda r: -r.seconds)],
            "linear_kernels": sorted(linear, key=lambda e: -e["ms"])}  # fmt: skip


def roofline(flops: float, moved: float, seconds: float, peak: float, stream: float) -> dict[str, Any]:
    """A linear kernel against its own roof: its flops at the peak (a bf16 kernel's: the fp32 peak x BF16_RATE, an
    int8 one's x int8_rate()) or the bytes it moves (operands, weights, outputs) at the stream bandwidth, whichever
    takes longer. A product over a handful of rows (a CNN's last stage on a small image, a classifier's matmul)
    does ~2 flops per weight: its roof is the weight stream."""
    compute, memory = flops / peak, moved / stream if stream > 0 else 0.0
    return {"bound": "memory" if memory > compute else "compute",
            "of_roofline": max(compute, memory) / seconds if seconds > 0 else 0.0}


def format_breakdown(report: dict[str, Any]) -> list[str]:
    total, kernels = report["total_ms"], report["kernels_ms"]
    overhead = (f"runtime overhead {report['overhead_ms']:.3f} ms" if report["overhead_ms"] > 0 else
                "no overhead visible: each kernel timed alone carries a dispatch the whole run overlaps")  # fmt: skip
    lines = [f"  breakdown: {total:.3f} ms end to end (median); kernels timed in place sum to {kernels:.3f} ms, "
             f"{overhead}; this machine: {report['peak_gflops']:.0f} GFLOP/s fp32 peak, "
             f"{report['bandwidth_gbs']:.1f} GB/s DRAM, {report.get('stream_gbs', 0.0):.1f} GB/s streamed by "
             "its threads; shares are of the kernels' sum"]  # fmt: skip
    for row in report["rows"]:
        ms = row["seconds"] * 1e3
        if row["flops"]:
            achieved = row["flops"] / row["seconds"] / 1e9 if row["seconds"] else 0.0
            against = f"{achieved:.0f} GFLOP/s = {achieved / report['peak_gflops']:.2f}x the fp32 peak"
            if row.get("roof_seconds") and row["seconds"]:
                against += f", {row['roof_seconds'] / row['seconds']:.2f}x their rooflines"
        elif row["bytes"]:
            achieved = row["bytes"] / row["seconds"] / 1e9 if row["seconds"] else 0.0
            against = f"{achieved:.1f} GB/s = {achieved / report['bandwidth_gbs']:.2f}x DRAM bandwidth (more in cache)"
        else:
            against = ""
        share = ms / kernels if kernels else 0.0
        lines.append(f"    {row['kind']:<42} {row['kernels']:>4} kernels {ms:>9.3f} ms {share:>5.0%}  {against}")
    slowest = report.get("linear_kernels", [])[:LISTED]
    if slowest:
        lines.append(f"  the {len(slowest)} slowest linear kernels, each against the fp32 peak and its roofline "
                     "(the peak or the stream, whichever bounds it):")  # fmt: skip
        lines += [f"    kernel {e['kernel']:>4} {e['ms']:>8.3f} ms {e['gflops']:>7.0f} GFLOP/s "
                  f"{e['of_fp32_peak']:>5.2f}x peak  {e['of_roofline']:>5.2f}x roofline ({e['bound']:<7})  "
                  f"{e['what']}" for e in slowest]  # fmt: skip
    return lines
