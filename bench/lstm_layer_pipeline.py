"""What pipelining stacked LSTM layers over the cores could gain (issue 13, deliverable 7), measured.

Today each layer's scan runs on both cores (its hidden units split between them, one barrier per step). A layer
pipeline would instead run layer l on one core and layer l+1 on the other, each single-threaded, side by side.
This times the generated scan of one lstm_tc-sized layer (hidden 256, sequence 100, batch 1) in place:

- split over 2 threads (what a plan does now, per layer);
- on 1 thread alone;
- two layers' scans (separate weights and state) on 1 thread each, at the same time.

Ten layers cost ~10 x the first figure today; a perfect two-core pipeline costs ~5 x the slower of the third
pair (plus filling and draining the pipeline, and its input projections, which today are one GEMM per layer).

    python bench/lstm_layer_pipeline.py [--reps 40]
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import numpy as np
from onnx import TensorProto, helper, numpy_helper

import kernorch
from kernorch.runtime.executor import Launcher
from kernorch.runtime.threads import thread_count

HIDDEN, SEQUENCE, FEATURES = 256, 100, 256


def _layer_model() -> object:
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array((rng.standard_normal((1, 4 * HIDDEN, n)) * 0.05).astype(np.float32), name)
               for name, n in (("W", FEATURES), ("R", HIDDEN))]  # fmt: skip
    bias = numpy_helper.from_array(np.zeros((1, 8 * HIDDEN), np.float32), "B")
    node = helper.make_node("LSTM", ["x", "W", "R", "B"], ["y"], hidden_size=HIDDEN)
    graph = helper.make_graph([node], "layer", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                              [SEQUENCE, 1, FEATURES])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [SEQUENCE, 1, 1, HIDDEN])],
                              [*weights, bias])  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _scan_launcher(model: object) -> Launcher:
    compiled = kernorch.compile(model, cost="analytic", rewrite=False)
    x = np.random.default_rng(1).standard_normal((SEQUENCE, 1, FEATURES)).astype(np.float32)
    compiled.run({"x": x})  # buffers hold a real input and the gates' projection
    executor = compiled.executor
    (scan,) = [k for k, kernel in enumerate(executor.kernels) if kernel.primitives[0].prim == "lstm_recurrence"]
    return executor.kernel_launcher(scan)


def _median(launch: Launcher, threads: int, reps: int, out: list[float]) -> None:
    with thread_count(threads):  # OpenMP's thread count is per calling thread
        launch()
        samples = []
        for _ in range(reps):
            started = time.perf_counter()
            launch()
            samples.append(time.perf_counter() - started)
    out.append(statistics.median(samples))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=40)
    args = parser.parse_args()
    layers = [_scan_launcher(_layer_model()) for _ in range(2)]
    cases = [("one scan split over 2 threads", [(0, 2)]), ("one scan on 1 thread", [(0, 1)]),
             ("two scans side by side, 1 thread each", [(0, 1), (1, 1)])]  # fmt: skip
    for label, runs in cases:
        results: list[list[float]] = [[] for _ in runs]
        workers = [threading.Thread(target=_median, args=(layers[i], n, args.reps, results[j]))
                   for j, (i, n) in enumerate(runs)]  # fmt: skip
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        print(f"{label}: " + ", ".join(f"{r[0] * 1e6:.0f} µs" for r in results))


if __name__ == "__main__":
    main()
