"""Throughput under concurrent callers: one kernorch model called from 1 and 2 threads at once, beside
onnxruntime's concurrent `InferenceSession.run` and OpenVINO's THROUGHPUT mode (fp32).

    python bench/concurrency.py ../shared/models/bert_mini.onnx [MODEL ...] [--seconds 3] [--rounds 5]

Each contender runs in a spawned process of its own with `cores // callers` threads per call (the calls
together use the machine's cores; OpenVINO gets all the cores and one infer request per caller, and picks
its streams itself). The callers call in a loop for `--seconds`; a round runs every contender once, rounds
are interleaved, and the table reports the median inferences per second over rounds. kernorch's plan is
optimized once (`--cost`, default profile) with one thread per call for 2 callers and 2 for 1 caller. Every
contender's outputs are checked against onnxruntime first.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import tempfile
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np

CONTENDERS = ("kernorch", "onnxruntime", "openvino-throughput")


def _serve(connection: Connection, contender: str, model_path: str, plan_dir: str, callers: int,
           threads: int) -> None:  # fmt: skip
    os.environ["OMP_NUM_THREADS"] = str(threads)
    feeds: dict[str, np.ndarray] = connection.recv()
    if contender == "onnxruntime":
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
        options.log_severity_level = 3
        session = ort.InferenceSession(model_path, options, providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        runs = [lambda: dict(zip(names, session.run(names, feeds), strict=True))] * callers
    elif contender == "openvino-throughput":
        import onnx
        import openvino as ov

        core = ov.Core()
        network = core.compile_model(core.read_model(model_path), "CPU", {
            "INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": "THROUGHPUT",
            "INFERENCE_NUM_THREADS": threads * callers})  # fmt: skip
        names = [output.name for output in onnx.load(model_path, load_external_data=False).graph.output]
        ports = list(zip(names, network.outputs, strict=True))

        def runner(request: Any) -> Any:
            def run() -> dict[str, np.ndarray]:
                request.infer(feeds)
                return {name: np.array(request.get_tensor(port).data) for name, port in ports}

            return run

        runs = [runner(network.create_infer_request()) for _ in range(callers)]
    else:
        import kernorch

        compiled = kernorch.load(plan_dir, threads=threads)
        runs = [lambda: compiled.run(feeds)] * callers
    connection.send(runs[0]())
    while True:
        seconds = connection.recv()
        if seconds is None:
            return
        connection.send(_throughput(runs, seconds))


def _throughput(runs: list[Any], seconds: float) -> float:
    """Inferences per second with one thread per entry of `runs`, each calling in a loop for `seconds`."""
    counts = [0] * len(runs)
    start = threading.Barrier(len(runs) + 1)
    stop = threading.Event()

    def caller(i: int) -> None:
        start.wait()
        while not stop.is_set():
            runs[i]()
            counts[i] += 1

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(len(runs))]
    for thread in threads:
        thread.start()
    for run in runs:  # warm: one call each, before the clock
        run()
    start.wait()
    began = time.perf_counter()
    time.sleep(seconds)
    stop.set()
    for thread in threads:
        thread.join()
    return sum(counts) / (time.perf_counter() - began)


def _worker(connection: Connection, *args: Any) -> None:
    try:
        _serve(connection, *args)
    except Exception as error:  # noqa: BLE001 - reported to the parent in one line
        connection.send(RuntimeError(f"{args[0]}: {type(error).__name__}: {str(error).splitlines()[0][:300]}"))


def bench(model_path: str, callers: int, seconds: float, rounds: int, cost: str) -> dict[str, float]:
    import kernorch
    from kernorch.runtime.feeds import graph_feeds
    from kernorch.tools.check import compare

    cores = os.cpu_count() or 2
    threads = max(cores // callers, 1)
    context = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory() as work:
        compiled = kernorch.compile(model_path, threads=threads, cost=cost)
        plan_dir = str(compiled.save(Path(work) / "plan"))
        feeds = graph_feeds(compiled.graph)
        workers: dict[str, tuple[Any, Connection]] = {}
        outputs: dict[str, dict[str, np.ndarray]] = {}
        try:
            for name in CONTENDERS:
                parent, child = context.Pipe()
                process = context.Process(target=_worker, args=(child, name, model_path, plan_dir, callers, threads))
                process.start()
                parent.send(feeds)
                answer = parent.recv()
                if isinstance(answer, Exception):
                    raise answer
                workers[name], outputs[name] = (process, parent), answer
            for name in CONTENDERS[:1] + CONTENDERS[2:]:
                worst = max(e.relative for e in compare(outputs[name], outputs["onnxruntime"]))
                if worst > 1e-3:
                    raise RuntimeError(f"{name} differs from onnxruntime: relative error {worst:.2e}")
            samples: dict[str, list[float]] = {name: [] for name in CONTENDERS}
            for _ in range(rounds):
                for name, (_, connection) in workers.items():
                    connection.send(seconds)
                    samples[name].append(connection.recv())
                    time.sleep(0.2)
        finally:
            for process, connection in workers.values():
                connection.send(None)
                process.join(30)
    return {name: float(np.median(values)) for name, values in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="+")
    parser.add_argument("--seconds", type=float, default=3.0, help="each contender's calling time per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--callers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--cost", default="profile", choices=("profile", "analytic"))
    args = parser.parse_args()
    print("| model | callers | threads/call | kernorch inf/s | onnxruntime inf/s | OpenVINO THROUGHPUT inf/s "
          "| kernorch / best peer |")
    print("|---|---|---|---|---|---|---|")
    for model in args.models:
        for callers in args.callers:
            result = bench(model, callers, args.seconds, args.rounds, args.cost)
            best = max(result["onnxruntime"], result["openvino-throughput"])
            threads = max((os.cpu_count() or 2) // callers, 1)
            print(f"| {Path(model).stem} | {callers} | {threads} | {result['kernorch']:.1f} | "
                  f"{result['onnxruntime']:.1f} | {result['openvino-throughput']:.1f} | "
                  f"{result['kernorch'] / best:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
