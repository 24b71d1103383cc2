"""Per-node comparison: each kernorch library call (timed in place, in a real inference) next to the
onnxruntime node(s) computing the same ONNX node (onnxruntime's own profiler, same inputs and threads).

    python bench/per_node.py MODEL.onnx [--runs 20] [--threads 2] [--op Conv]

Prints one row per ONNX node of the given op type: kernorch µs per call (its kernel includes whatever it
absorbed), onnxruntime µs per call (summed over the nodes named after it, e.g. a FusedConv), and totals.
Performance claims come from `kernorch bench`; this table explains where the time goes.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np
import onnx

from kernorch.codegen.library import absorbed_summary
from kernorch.options import Options
from kernorch.pipeline import compile_plan, plan_model
from kernorch.runtime.feeds import graph_feeds


def onnxruntime_node_times(model_path: str, feeds: dict[str, np.ndarray], threads: int, runs: int) -> dict[str, float]:
    """Median µs per ONNX node name (a fused node counts for every name it contains)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    with tempfile.TemporaryDirectory() as work:
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(work) / "ort")
        session = ort.InferenceSession(model_path, options, providers=["CPUExecutionProvider"])
        for _ in range(5):
            session.run(None, feeds)
        session.end_profiling()  # the warm-up is not measured: start a fresh profile
        session = ort.InferenceSession(model_path, options, providers=["CPUExecutionProvider"])
        for _ in range(runs + 1):
            session.run(None, feeds)
        events = json.loads(Path(session.end_profiling()).read_text())
    per_name: dict[str, list[float]] = defaultdict(list)
    for event in events:
        if event.get("cat") == "Node" and event.get("name", "").endswith("_kernel_time"):
            per_name[event["name"].removesuffix("_kernel_time")].append(float(event["dur"]))
    return {name: float(np.median(durations[1:] or durations)) for name, durations in per_name.items()}


# what onnxruntime fuses into a conv (its NCHWc node then carries the last fused node's output name)
FUSED_AFTER = {"Relu", "Clip", "Add", "Sigmoid", "Mul", "HardSigmoid", "LeakyRelu"}


def _named_after_their_op(times: dict[str, float], proto: onnx.ModelProto, op: str) -> dict[str, float]:
    """onnxruntime's NCHWc nodes are named after the value they write (`<value>_nchwc`), the last of the ONNX nodes
    they fused (a conv's relu or residual add): each such time is given the name of the `op` node it starts from,
    found by walking back through the fused nodes' first inputs."""
    producer = {output: node for node in proto.graph.node for output in node.output}
    renamed: dict[str, float] = {}
    for name, micros in times.items():
        node = producer.get(name.removesuffix("_nchwc")) if name.endswith("_nchwc") else None
        for _ in range(3):
            if node is None or node.op_type not in FUSED_AFTER or not node.input:
                break
            node = producer.get(node.input[0])
        key = node.name if node is not None and node.op_type == op else name
        renamed[key] = renamed.get(key, 0.0) + micros
    return renamed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--op", default="Conv", help="ONNX op type to tabulate (default Conv)")
    parser.add_argument("--top", type=int, default=0, help="also list kernorch's N slowest kernels in place")
    args = parser.parse_args()
    options = Options(threads=args.threads)
    result = plan_model(args.model, options=options)
    compiled = compile_plan(result, options)
    feeds = graph_feeds(compiled.graph)
    ours = compiled.executor.kernel_times(feeds, args.runs)
    theirs = onnxruntime_node_times(args.model, feeds, args.threads, args.runs)
    proto = onnx.load(args.model)
    wanted = [n.name for n in proto.graph.node if n.op_type == args.op]
    theirs = _named_after_their_op(theirs, proto, args.op)
    graph = compiled.graph
    rows = []
    for name in wanted:
        kernels = [k for k, kernel in enumerate(compiled.kernels)
                   if any(graph.nodes[i].origin == name and graph.nodes[i].prim.startswith(("conv", "matmul"))
                          for i in kernel.nodes)]  # fmt: skip
        mine = sum(ours[k] for k in kernels) * 1e6
        absorbed = "; ".join(absorbed_summary(compiled.kernels[k]) or "" for k in kernels)
        ort_names = [n for n in theirs if n == name or n.startswith(name + "_")]
        rows.append((name, mine, sum(theirs[n] for n in ort_names), absorbed))
    width = max((len(r[0]) for r in rows), default=4)
    print(f"{'node':<{width}}  {'kernorch us':>11}  {'onnxruntime us':>14}  ratio  kernorch kernel")
    for name, mine, other, absorbed in rows:
        ratio = f"{other / mine:5.2f}" if mine and other else "    -"
        print(f"{name:<{width}}  {mine:>11.1f}  {other:>14.1f}  {ratio}  {absorbed}")
    total_mine, total_other = sum(r[1] for r in rows), sum(r[2] for r in rows)
    print(f"{'total':<{width}}  {total_mine:>11.1f}  {total_other:>14.1f}  "
          f"{(total_other / total_mine if total_mine else 0):5.2f}")
    if args.top > 0:
        print(f"\nkernorch's {args.top} slowest kernels in place (µs per call):")
        for k in sorted(range(len(ours)), key=lambda k: -ours[k])[: args.top]:
            kernel = compiled.kernels[k]
            prims = [graph.nodes[i].prim for i in kernel.nodes]
            shape = graph.types[kernel.outputs[0]].shape if kernel.outputs else ()
            what = absorbed_summary(kernel) or " ".join(prims[:8]) + (" …" if len(prims) > 8 else "")
            print(f"  {ours[k] * 1e6:9.1f}  {compiled.executor.backends[k].name:<11} {list(shape)!s:<20} {what}")
    print(f"whole model, sum of kernels in place: kernorch {sum(ours) * 1e3:.3f} ms; onnxruntime nodes "
          f"{sum(theirs.values()) / 1e3:.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
