"""A day of serving in a minute: many threads call one model with symbolic dims at random shapes, and nothing
leaks, nothing fails, nothing drifts.

Three copies of a small transformer-style block with a symbolic batch (matmul + bias, layer norm, tanh, matmul,
softmax) serve side by side: the compiled DynamicModel (buckets 1, 2, 4, 8; the sizes between them padded up to
the next bucket, as the padding proof allows), the same model saved and loaded back, and a bf16 copy (where the
CPU has bf16). `--threads` callers (8) each pick a copy and a batch size 1..8 at random, call it, and compare the
output with onnxruntime's on the same input; until `--calls` calls (100 000) or `--minutes` have passed. Each
plan's workspaces are bounded by `--max-workspaces` (3: the callers beyond wait). Reported: calls, errors,
resident memory after warm-up (its slope by least squares, in KiB per 1 000 calls), peak workspaces, open file
descriptors and OS threads before and after.

`make soak` runs the full length; tests/test_soak.py a short one in `make test`.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

WIDTH, HIDDEN = 24, 48
BUCKETS = (1, 2, 4, 8)
TOLERANCE = {"fp32": (1e-4, 1e-5), "bf16": (3e-2, 3e-3)}  # rtol, atol: bf16 rounds the matmuls' operands


def soak_model() -> onnx.ModelProto:
    rng = np.random.default_rng(17)

    def weight(name: str, *shape: int) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name)

    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["hb"]),
             helper.make_node("LayerNormalization", ["hb", "gamma", "beta"], ["n"], axis=-1),
             helper.make_node("Tanh", ["n"], ["t"]), helper.make_node("MatMul", ["t", "w2"], ["m"]),
             helper.make_node("Softmax", ["m"], ["y"], axis=-1)]  # fmt: skip
    weights = [weight("w1", WIDTH, HIDDEN), weight("b1", HIDDEN), weight("gamma", HIDDEN), weight("beta", HIDDEN),
               weight("w2", HIDDEN, WIDTH)]  # fmt: skip
    graph = helper.make_graph(nodes, "soak", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", WIDTH])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", WIDTH])], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def os_threads() -> int:
    return len(os.listdir("/proc/self/task"))


@dataclass
class SoakReport:
    calls: int = 0
    errors: int = 0
    seconds: float = 0.0
    copies: list[str] = field(default_factory=list)
    calls_per_copy: dict[str, int] = field(default_factory=dict)
    padded_calls: int = 0  # calls at a size between buckets (run on the next bucket's plan)
    rss_after_warmup_mib: float = 0.0
    rss_end_mib: float = 0.0
    rss_slope_kib_per_1000_calls: float = 0.0
    peak_workspaces: int = 0
    max_workspaces: int = 0
    fds_before: int = 0
    fds_after: int = 0
    threads_before: int = 0
    threads_after: int = 0
    first_errors: list[str] = field(default_factory=list)


def _copies(model: onnx.ModelProto, work: Path, max_workspaces: int) -> dict[str, Any]:
    import kernorch
    from kernorch.errors import KernorchError
    from kernorch.machine import check_bf16_supported

    options: dict[str, Any] = {"cost": "analytic", "device": "cpu-nominal", "buckets": {"batch": BUCKETS},
                               "pad": ("batch",), "max_workspaces": max_workspaces, "cache_dir": work / "cache"}
    compiled = kernorch.compile(model, **options)
    copies = {"compiled": compiled,
              "reloaded": kernorch.load(compiled.save(work / "saved"), cache_dir=work / "cache",
                                        max_workspaces=max_workspaces)}  # fmt: skip
    try:
        check_bf16_supported()
        copies["bf16"] = kernorch.compile(model, precision="bf16", **options)
    except KernorchError as reason:  # no bf16 on this CPU: two copies, and the report says so
        print(f"soak: no bf16 copy ({reason})", flush=True)
    return copies


def soak(calls: int = 100_000, threads: int = 8, minutes: float | None = None, max_workspaces: int = 3,
         seed: int = 0, progress: bool = False) -> SoakReport:  # fmt: skip
    import onnxruntime as ort

    model = soak_model()
    report = SoakReport(max_workspaces=max_workspaces)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    with tempfile.TemporaryDirectory(prefix="kernorch-soak-") as work, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        copies = _copies(model, Path(work), max_workspaces)
        report.copies = list(copies)
        names = list(copies)
        warmup = max(calls // 10, threads * len(names) * len(BUCKETS))
        deadline = time.monotonic() + 60 * minutes if minutes else None
        lock = threading.Lock()
        done = 0
        samples: list[tuple[int, int]] = []
        sample_every = max(calls // 400, 1)
        per_copy = dict.fromkeys(names, 0)
        for name in names:  # every copy and bucket once before the baseline: plans made, OpenMP teams started
            for batch in range(1, BUCKETS[-1] + 1):
                copies[name].run({"x": np.ones((batch, WIDTH), np.float32)})
        report.fds_before, report.threads_before = open_fds(), os_threads()

        def caller(index: int) -> None:
            nonlocal done
            rng = np.random.default_rng(seed * 1000 + index)
            while True:
                with lock:
                    if done >= calls or (deadline is not None and time.monotonic() > deadline):
                        return
                    done += 1
                    number = done
                name = names[int(rng.integers(len(names)))]
                batch = int(rng.integers(1, BUCKETS[-1] + 1))
                x = rng.standard_normal((batch, WIDTH)).astype(np.float32)
                problem = None
                try:
                    actual = copies[name].run({"x": x})["y"]
                    expected = session.run(["y"], {"x": x})[0]
                    rtol, atol = TOLERANCE["bf16" if name == "bf16" else "fp32"]
                    if actual.shape != expected.shape or not np.allclose(actual, expected, rtol=rtol, atol=atol):
                        problem = f"{name} batch {batch}: max error {float(np.max(np.abs(actual - expected))):.3g}"
                except Exception as error:  # noqa: BLE001 - every failure counts, whatever it is
                    problem = f"{name} batch {batch}: {type(error).__name__}: {error}"
                with lock:
                    per_copy[name] += 1
                    report.padded_calls += batch not in BUCKETS
                    if problem is not None:
                        report.errors += 1
                        if len(report.first_errors) < 5:
                            report.first_errors.append(problem)
                    if number >= warmup and number % sample_every == 0:
                        samples.append((number, resident_bytes()))
                    if progress and number % max(calls // 20, 1) == 0:
                        print(f"soak: {number} calls, {report.errors} errors, rss "
                              f"{resident_bytes() / 2**20:.1f} MiB", flush=True)  # fmt: skip

        started = time.perf_counter()
        workers = [threading.Thread(target=caller, args=(i,), name=f"soak-{i}") for i in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        report.seconds = round(time.perf_counter() - started, 2)
        report.calls = done
        report.calls_per_copy = per_copy
        settled = time.monotonic() + 5  # a finished caller's OpenMP team exits after it: give it a moment
        while os_threads() > report.threads_before and time.monotonic() < settled:
            time.sleep(0.05)
        report.fds_after, report.threads_after = open_fds(), os_threads()
        report.peak_workspaces = max(plan.executor.peak_workspaces for copy in copies.values()
                                     for plan in copy.specialisations.values())  # fmt: skip
        if len(samples) >= 2:
            x, y = np.array([s[0] for s in samples], float), np.array([s[1] for s in samples], float)
            report.rss_slope_kib_per_1000_calls = round(float(np.polyfit(x, y, 1)[0]) * 1000 / 1024, 3)
            report.rss_after_warmup_mib = round(samples[0][1] / 2**20, 1)
        report.rss_end_mib = round(resident_bytes() / 2**20, 1)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=100_000, help="calls in all (default 100000)")
    parser.add_argument("--threads", type=int, default=8, help="calling threads (default 8)")
    parser.add_argument("--minutes", type=float, default=None, help="stop after this long, if sooner")
    parser.add_argument("--max-workspaces", type=int, default=3, help="workspaces per plan (default 3)")
    parser.add_argument("--json", action="store_true", help="the report as JSON")
    args = parser.parse_args(argv)
    report = soak(args.calls, args.threads, args.minutes, args.max_workspaces, progress=not args.json)
    if args.json:
        print(json.dumps(asdict(report), indent=1))
    else:
        for key, value in asdict(report).items():
            print(f"{key:>30}: {value}")
    return 1 if report.errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
