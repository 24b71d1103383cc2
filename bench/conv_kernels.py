"""kernorch's own conv kernels against oneDNN on the same call: the direct depthwise conv (with and without a
bias + swish epilogue) on the depthwise shapes of efficientnet_b0, shufflenet_v2 and segformer_b0, and the
Winograd F(2x2, 3x3) conv on candy's 3x3 convs. Each is one channels-last kernel run by PlanExecutor, timed
with oneDNN forced and with kernorch's kernel, best median of `--rounds`, same threads.

    python bench/conv_kernels.py [--threads 2] [--rounds 3]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from functools import partial

import numpy as np

from kernorch.codegen.library import onednn as c_library
from kernorch.ir.graph import Graph, Node
from kernorch.ir.kernel import make_kernel
from kernorch.ir.types import TensorType
from kernorch.runtime.executor import PlanExecutor
from kernorch.runtime.threads import thread_count
from kernorch.runtime.timing import time_call

# (H, W, channels, kernel, stride, bias + swish)
DEPTHWISE = [(112, 112, 32, 3, 1, True), (112, 112, 96, 3, 2, True), (56, 56, 144, 3, 1, True),
             (56, 56, 144, 5, 2, True), (28, 28, 240, 5, 1, True), (28, 28, 240, 3, 2, True),
             (14, 14, 480, 3, 1, True), (14, 14, 672, 5, 1, True), (14, 14, 672, 5, 2, True),
             (7, 7, 1152, 5, 1, True), (7, 7, 1152, 3, 1, True), (28, 28, 58, 3, 1, False),
             (56, 56, 58, 3, 2, False), (14, 14, 116, 3, 1, False), (28, 28, 116, 3, 2, False),
             (7, 7, 232, 3, 1, False), (14, 14, 232, 3, 2, False), (128, 128, 128, 3, 1, False),
             (64, 64, 256, 3, 1, False), (32, 32, 640, 3, 1, False), (16, 16, 1024, 3, 1, False)]  # fmt: skip
# (H, W of the padded input, in channels, out channels)
WINOGRAD = [(58, 58, 128, 128), (226, 226, 64, 32), (114, 114, 128, 64)]


def conv_seconds(h: int, w: int, c_in: int, c_out: int, kernel: int, stride: int, depthwise: bool, swish: bool,
                 threads: int, rounds: int) -> float:  # fmt: skip
    rng = np.random.default_rng(0)
    pad = kernel // 2 if depthwise else 0
    oh, ow = (h + 2 * pad - kernel) // stride + 1, (w + 2 * pad - kernel) // stride + 1
    graph = Graph(inputs=["x"], outputs=["z" if swish else "y"], name="conv")
    weights = (c_out, 1 if depthwise else c_in, kernel, kernel)
    graph.constants = {"w": (rng.standard_normal(weights) * 0.1).astype(np.float32),
                       "b": rng.standard_normal(c_out).astype(np.float32)}  # fmt: skip
    out = TensorType((1, oh, ow, c_out), "float32")
    graph.types = {"x": TensorType((1, h, w, c_in), "float32"), "w": TensorType(weights, "float32"),
                   "b": TensorType((c_out,), "float32"), "y": out, "yb": out, "s": out, "z": out}  # fmt: skip
    attrs = (("channels_last", True), ("dilations", (1, 1)), ("group", c_out if depthwise else 1),
             ("kernel_shape", (kernel, kernel)), ("pads", (pad,) * 4), ("strides", (stride, stride)))  # fmt: skip
    graph.nodes = [Node("conv", ("x", "w"), ("y",), attrs)]
    if swish:
        graph.nodes += [Node("add", ("y", "b"), ("yb",)), Node("sigmoid", ("yb",), ("s",)),
                        Node("mul", ("yb", "s"), ("z",))]  # fmt: skip
    executor = PlanExecutor(graph, [make_kernel(graph, tuple(range(len(graph.nodes))), tuple(graph.outputs))],
                            threads)  # fmt: skip
    executor.buffers["x"][...] = rng.standard_normal((1, h, w, c_in))
    (step,) = executor.steps
    with thread_count(threads):
        return min(time_call(step, runs=100, warmup=10).median for _ in range(rounds))


def both(measure: Callable[[], float], rejection: str) -> tuple[float, float]:
    """(oneDNN seconds, kernorch's kernel seconds): `rejection` names c_library's check that is forced."""
    real = getattr(c_library, rejection)
    setattr(c_library, rejection, lambda call: "forced to oneDNN")
    try:
        onednn = measure()
    finally:
        setattr(c_library, rejection, real)
    return onednn, measure()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print("| depthwise H x W x C, kernel/stride | epilogue | oneDNN µs | kernorch µs | oneDNN / kernorch |")
    print("|---|---|---|---|---|")
    for h, w, c, k, s, swish in DEPTHWISE:
        measure = partial(conv_seconds, h, w, c, c, k, s, True, swish, args.threads, args.rounds)
        onednn, ours = both(measure, "depthwise_rejection")
        print(f"| {h}x{w}x{c}, {k}x{k}/{s} | {'bias, swish' if swish else '-'} | {onednn * 1e6:.1f} | "
              f"{ours * 1e6:.1f} | {onednn / ours:.2f} |")
    print("\n| 3x3 conv, padded input H x W, C_in → C_out | oneDNN µs | Winograd µs | oneDNN / Winograd |")
    print("|---|---|---|---|")
    for h, w, c_in, c_out in WINOGRAD:
        measure = partial(conv_seconds, h, w, c_in, c_out, 3, 1, False, False, args.threads, args.rounds)
        onednn, ours = both(measure, "winograd_rejection")
        print(f"| {h}x{w}, {c_in} → {c_out} | {onednn * 1e6:.0f} | {ours * 1e6:.0f} | {onednn / ours:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
