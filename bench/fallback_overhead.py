"""What the onnxruntime fallback costs: a model whose quantization nodes kernorch has no rule for (written by
onnxruntime's own `quantize_dynamic`), timed as onnxruntime runs it and as kernorch runs it (those nodes through
one-node onnxruntime sessions, the rest compiled), each in its own process, same inputs and threads.

    .venv/bin/python bench/fallback_overhead.py [MODEL.onnx ...] [--threads 2] [--runs 200]

Without models: a 6-layer 768-wide MLP on 128 rows, and the shared bert_mini, both dynamically quantized (int8
weights). Prints each contender's median and kernorch's time over onnxruntime's.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

_WORKER = r"""
import json, sys, time, warnings
import numpy as np
warnings.simplefilter("ignore")
path, contender, threads, runs = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
from kernorch.pipeline import import_graph
from kernorch.runtime.feeds import graph_feeds
feeds = graph_feeds(import_graph(path))  # token ids inside the table they index
if contender == "onnxruntime":
    import onnxruntime as ort
    options = ort.SessionOptions(); options.intra_op_num_threads = threads
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    run = lambda: session.run(None, feeds)
else:
    import kernorch
    model = kernorch.compile(path, cost="analytic", threads=threads)
    run = lambda: model.run(feeds)
for _ in range(10):
    run()
times = []
for _ in range(runs):
    start = time.perf_counter(); run(); times.append(time.perf_counter() - start)
print(json.dumps({"median_ms": float(np.median(times)) * 1e3}))
"""


def mlp(path: Path, layers: int = 6, width: int = 768, rows: int = 128) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, weights, x = [], [], "x"
    for i in range(layers):
        weight = (rng.standard_normal((width, width)) * 0.05).astype(np.float32)
        weights.append(numpy_helper.from_array(weight, f"w{i}"))
        nodes += [helper.make_node("MatMul", [x, f"w{i}"], [f"m{i}"]), helper.make_node("Relu", [f"m{i}"], [f"r{i}"])]
        x = f"r{i}"
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, (rows, width))]
    outputs = [helper.make_tensor_value_info(x, TensorProto.FLOAT, (rows, width))]
    graph = helper.make_graph(nodes, "mlp", inputs, outputs, weights)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def quantized(source: Path, directory: Path) -> Path:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    target = directory / f"{source.stem}_dynamic_int8.onnx"
    quantize_dynamic(str(source), str(target), weight_type=QuantType.QInt8)
    return target


def time_in_process(path: Path, contender: str, threads: int, runs: int) -> float:
    """The contender's median in a process of its own, importing the kernorch this script imported (a worktree's
    through PYTHONPATH, to time another commit)."""
    import kernorch

    checkout = Path(kernorch.__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", _WORKER, str(path), contender, str(threads), str(runs)],
                          capture_output=True, text=True, check=True, cwd=checkout)  # fmt: skip
    return float(json.loads(done.stdout.strip().splitlines()[-1])["median_ms"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="*", type=Path, help="float32 models to quantize (default: see above)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        directory = Path(scratch)
        sources = list(args.models)
        if not sources:
            mlp(directory / "mlp768.onnx")
            sources = [directory / "mlp768.onnx", ROOT.parent / "shared" / "models" / "bert_mini.onnx"]
        print("| model | onnxruntime ms | kernorch ms | kernorch / onnxruntime |\n|---|---|---|---|")
        for source in sources:
            model = quantized(source, directory)
            ort_ms = time_in_process(model, "onnxruntime", args.threads, args.runs)
            kernorch_ms = time_in_process(model, "kernorch", args.threads, args.runs)
            print(f"| {model.stem} | {ort_ms:.3f} | {kernorch_ms:.3f} | {kernorch_ms / ort_ms:.2f}x |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
