"""Requests of varying length as a server sees them, from a cold start: kernorch against onnxruntime (and OpenVINO)
on a model with a symbolic sequence dim (bench/dynamic/export.py writes bert_mini with one).

    .venv/bin/python bench/varying_length.py MODEL.onnx [--dim sequence] [--lengths 8..200[:STEP]] [--requests 24]
                                           [--fixed height=224,width=224] [--range SPEC] [--threads 2]
                                           [--contenders ...] [--json OUT.json]

`requests` lengths drawn (seeded) from the range (every STEP-th size), 23 distinct among 24 by default, every
other symbolic dim 1 or its `--fixed` size (a CNN's batch varying at 224x224: `--dim batch --lengths 1..32 --fixed
height=224,width=224`). Several dims (`--dim height,width`) take the same drawn size (square images: a detector at
`--lengths 320..640:64`). kernorch's range is the dims' LOW..HIGH[:STEP] unless `--range` gives another (a detector
planned for every multiple of 32, called at multiples of 64: `--range batch=1,height=320..640:32,width=320..640:32`).
Each contender runs in a process of its own, one after the other: it prepares the model (kernorch.compile with the
range: one shape-generic plan; `kernorch-serve` without it: each new length served by onnxruntime, planned once
called again and again; onnxruntime's and OpenVINO's session creation — reported, not counted), then runs the
requests twice: the first pass is what the first requests cost, the second the steady state. Reported: each
pass's total, per-request percentiles, and the largest relative difference from onnxruntime's outputs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from decode import percentiles, runner  # bench/decode.py: this script's directory is on the path

from kernorch.options import parse_size_range

CONTENDERS = ("kernorch", "kernorch-serve", "onnxruntime", "openvino")


def _inputs(model: Path) -> dict[str, tuple[list[int | str], int]]:
    """Each input's dims (a symbolic one by name) and ONNX element type."""
    graph = onnx.load(str(model), load_external_data=False).graph
    initializers = {i.name for i in graph.initializer}
    return {i.name: ([d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim], i.type.tensor_type.elem_type)
            for i in graph.input if i.name not in initializers}  # fmt: skip


def requests(model: Path, dims: list[str], lengths: str, count: int,
             fixed: dict[str, int]) -> list[dict[str, np.ndarray]]:  # fmt: skip
    rng = np.random.default_rng(0)
    ((_, low, high, step),) = parse_size_range(f"size={lengths}")  # LOW..HIGH[:STEP], as a range reads it
    drawn = rng.integers(low // step, high // step + 1, count) * step
    drawn[-1] = drawn[0]  # one length repeats: 23 distinct among 24
    made = []
    for length in drawn:
        feeds = {}
        for name, (shape_of, kind) in _inputs(model).items():
            shape = tuple(int(length) if d in dims else (fixed.get(d, 1) if isinstance(d, str) else d)
                          for d in shape_of)  # fmt: skip
            if kind == onnx.TensorProto.INT64:
                feeds[name] = rng.integers(0, 1000, shape).astype(np.int64)
            else:
                feeds[name] = rng.standard_normal(shape).astype(np.float32)
        made.append(feeds)
    return made


def range_spec(model: Path, dims: list[str], lengths: str, fixed: dict[str, int]) -> str:
    """kernorch's range for the requests: the varying dims over `lengths`, every other symbolic dim fixed."""
    others = [d for shape, _ in _inputs(model).values() for d in shape if isinstance(d, str) and d and d not in dims]
    return ",".join([*(f"{d}={fixed.get(d, 1)}" for d in dict.fromkeys(others)), *(f"{d}={lengths}" for d in dims)])


def worker(name: str, model: Path, threads: int, dims: list[str], lengths: str, count: int, fixed: dict[str, int],
           spec: str) -> dict[str, Any]:  # fmt: skip
    calls = requests(model, dims, lengths, count, fixed)
    started = time.perf_counter()
    run = runner(name, model, threads, [spec])
    prepared = time.perf_counter() - started
    passes = []
    for _ in range(2):
        times, outputs = [], []
        for feeds in calls:
            started = time.perf_counter()
            result = run(feeds)
            times.append((time.perf_counter() - started) * 1e3)
            outputs.append(np.asarray(result[0]))
        passes.append(times)
    path = Path(os.environ.get("KO_VARYING_OUT", "/tmp")) / f"varying-{name}.npz"
    np.savez(path, *outputs)
    return {"prepare_s": prepared, "first_ms": passes[0], "steady_ms": passes[1], "outputs": str(path)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", type=Path)
    parser.add_argument("--dim", default="sequence", help="the symbolic dims that vary, together (default sequence)")
    parser.add_argument("--lengths", default="8..200", help="their sizes, LOW..HIGH[:STEP] (default 8..200)")
    parser.add_argument("--range", help="kernorch's range (default: the dims over --lengths, the others fixed)")
    parser.add_argument("--requests", type=int, default=24)
    parser.add_argument("--fixed", default="", help="other symbolic dims' sizes, NAME=SIZE,... (default 1)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--contenders", default=",".join(CONTENDERS))
    parser.add_argument("--json", type=Path, help="write every figure here")
    parser.add_argument("--worker", choices=CONTENDERS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    dims = args.dim.split(",")
    fixed = {name: int(size) for name, _, size in (part.partition("=") for part in args.fixed.split(",") if part)}
    spec = args.range or range_spec(args.model, dims, args.lengths, fixed)
    if args.worker:
        print(json.dumps(worker(args.worker, args.model, args.threads, dims, args.lengths, args.requests, fixed, spec)))
        return 0
    results: dict[str, Any] = {}
    for name in args.contenders.split(","):
        command = [sys.executable, __file__, str(args.model), "--worker", name, "--dim", args.dim, "--lengths",
                   args.lengths, "--requests", str(args.requests), "--threads", str(args.threads), "--fixed",
                   args.fixed, "--range", spec]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, env=os.environ.copy())
        if done.returncode:
            results[name] = {"error": (done.stderr.strip().splitlines() or ["exit " + str(done.returncode)])[-1]}
            continue
        results[name] = json.loads(done.stdout.strip().splitlines()[-1])
    reference = results.get("onnxruntime", {}).get("outputs")
    want = list(np.load(reference).values()) if reference else None
    print(f"{args.model.name}: {args.requests} requests, {args.dim} in {args.lengths} {args.fixed} (range {spec}); "
          f"{args.threads} threads; "
          f"{platform.processor() or platform.machine()}")  # fmt: skip
    print("| contender | prepare s | first pass ms | steady pass ms | first pass per request p50/p90/p99 ms "
          "| steady per request p50/p90/p99 ms | rel. err vs onnxruntime |")
    print("|---|---|---|---|---|---|---|")
    for name, result in results.items():
        if "error" in result:
            print(f"| {name} | failed: {result['error'][:150]} ||||||")
            continue
        error = "—"
        if want is not None:
            got = list(np.load(result["outputs"]).values())
            worst = max(float(np.abs(g - w).max() / max(1.0, np.abs(w).max())) for g, w in zip(got, want, strict=True))
            error = f"{worst:.1e}"
        first, steady = result["first_ms"], result["steady_ms"]
        print(f"| {name} | {result['prepare_s']:.2f} | {sum(first):.1f} | {sum(steady):.1f} | {percentiles(first)} | "
              f"{percentiles(steady)} | {error} |")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps({"model": str(args.model), "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
