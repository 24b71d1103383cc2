"""kernorch's own conv kernels against oneDNN on the same call: the direct depthwise conv (with and without a
bias + swish epilogue) on the depthwise shapes of efficientnet_b0, shufflenet_v2 and segformer_b0, the
Winograd F(2x2, 3x3) conv on candy's 3x3 convs, and on CPUs without AVX-512 the panel kernel (1x1) and the
grouped kernel's dense panels (3x3) with relu on MobileNetV4's, RegNet's and ResNeXt's shapes, beside oneDNN's
conv alone (what the plan pays before a separate relu pass). Each is one channels-last kernel run by
PlanExecutor, timed with oneDNN forced and with kernorch's kernel, best median of `--rounds`, same threads.

    python bench/conv_kernels.py [--threads 2] [--rounds 3]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from functools import partial

import numpy as np

from kernorch import machine
from kernorch.codegen.backends.library_calls import LibraryCallBackend
from kernorch.codegen.native import depthwise_conv, grouped_conv, panel_conv, winograd_conv
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
# (H, W, in channels, out channels): 1x1 convs followed by relu (MobileNetV4's expansions, RegNet's, ResNeXt's)
PANEL = [(56, 56, 32, 32), (14, 14, 96, 192), (7, 7, 128, 512), (28, 28, 128, 512), (7, 7, 440, 440),
         (14, 14, 208, 208), (14, 14, 512, 1024)]  # fmt: skip
# (H, W, in channels, out channels, stride): 3x3 convs followed by relu (MobileNetV4's first stages)
DENSE = [(112, 112, 32, 32, 2), (56, 56, 32, 96, 2), (112, 112, 16, 64, 2)]


def conv_seconds(h: int, w: int, c_in: int, c_out: int, kernel: int, stride: int, depthwise: bool, epilogue: str,
                 threads: int, rounds: int, padded: bool = False) -> float:  # fmt: skip
    """Median seconds of one channels-last conv (+ bias and `epilogue`: "", "swish" or "relu") as one kernel, padded
    by half its window where it is depthwise or `padded` (Winograd's inputs come padded already)."""
    rng = np.random.default_rng(0)
    pad = kernel // 2 if depthwise or padded else 0
    oh, ow = (h + 2 * pad - kernel) // stride + 1, (w + 2 * pad - kernel) // stride + 1
    graph = Graph(inputs=["x"], outputs=["z" if epilogue else "y"], name="conv")
    weights = (c_out, 1 if depthwise else c_in, kernel, kernel)
    graph.constants = {"w": (rng.standard_normal(weights) * 0.1).astype(np.float32),
                       "b": rng.standard_normal(c_out).astype(np.float32)}  # fmt: skip
    out = TensorType((1, oh, ow, c_out), "float32")
    graph.types = {"x": TensorType((1, h, w, c_in), "float32"), "w": TensorType(weights, "float32"),
                   "b": TensorType((c_out,), "float32"), "y": out, "yb": out, "s": out, "z": out}  # fmt: skip
    attrs = (("channels_last", True), ("dilations", (1, 1)), ("group", c_out if depthwise else 1),
             ("kernel_shape", (kernel, kernel)), ("pads", (pad,) * 4), ("strides", (stride, stride)))  # fmt: skip
    graph.nodes = [Node("conv", ("x", "w"), ("y",), attrs)]
    if epilogue == "swish":
        graph.nodes += [Node("add", ("y", "b"), ("yb",)), Node("sigmoid", ("yb",), ("s",)),
                        Node("mul", ("yb", "s"), ("z",))]  # fmt: skip
    elif epilogue == "relu":
        graph.nodes += [Node("add", ("y", "b"), ("yb",)), Node("relu", ("yb",), ("z",))]
    executor = PlanExecutor(graph, [make_kernel(graph, tuple(range(len(graph.nodes))), tuple(graph.outputs))],
                            threads)  # fmt: skip
    executor.buffers["x"][...] = rng.standard_normal((1, h, w, c_in))
    (step,) = executor.steps
    with thread_count(threads):
        return min(time_call(step, runs=100, warmup=10).median for _ in range(rounds))


def both(measure: Callable[[], float], backend: LibraryCallBackend) -> tuple[float, float]:
    """(oneDNN seconds, kernorch's kernel seconds): `backend`, the kernel's, declines the first measurement."""
    real = backend.rejection
    backend.rejection = lambda call: "forced to oneDNN"
    try:
        onednn = measure()
    finally:
        backend.rejection = real
    return onednn, measure()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print("| depthwise H x W x C, kernel/stride | epilogue | oneDNN µs | kernorch µs | oneDNN / kernorch |")
    print("|---|---|---|---|---|")
    for h, w, c, k, s, swish in DEPTHWISE:
        measure = partial(conv_seconds, h, w, c, c, k, s, True, "swish" if swish else "", args.threads, args.rounds)
        onednn, ours = both(measure, depthwise_conv.BACKEND)
        print(f"| {h}x{w}x{c}, {k}x{k}/{s} | {'bias, swish' if swish else '-'} | {onednn * 1e6:.1f} | "
              f"{ours * 1e6:.1f} | {onednn / ours:.2f} |")
    print("\n| 3x3 conv, padded input H x W, C_in → C_out | oneDNN µs | Winograd µs | oneDNN / Winograd |")
    print("|---|---|---|---|")
    for h, w, c_in, c_out in WINOGRAD:
        measure = partial(conv_seconds, h, w, c_in, c_out, 3, 1, False, "", args.threads, args.rounds)
        onednn, ours = both(measure, winograd_conv.BACKEND)
        print(f"| {h}x{w}, {c_in} → {c_out} | {onednn * 1e6:.0f} | {ours * 1e6:.0f} | {onednn / ours:.2f} |")
    if machine.avx512():
        return 0  # the panel and dense kernels are for CPUs without AVX-512
    print("\n| conv + relu, H x W, C_in → C_out, kernel/stride | oneDNN conv alone µs | oneDNN conv + relu µs "
          "| kernorch µs | oneDNN + relu / kernorch |")
    print("|---|---|---|---|---|")
    shapes = [(*shape, 1, 1, panel_conv.BACKEND) for shape in PANEL] + \
        [(h, w, c_in, c_out, 3, s, grouped_conv.BACKEND) for h, w, c_in, c_out, s in DENSE]  # fmt: skip
    for h, w, c_in, c_out, k, s, backend in shapes:
        measure = partial(conv_seconds, h, w, c_in, c_out, k, s, False)
        alone, _ = both(partial(measure, "", args.threads, args.rounds, padded=True), backend)
        onednn, ours = both(partial(measure, "relu", args.threads, args.rounds, padded=True), backend)
        print(f"| {h}x{w}, {c_in} → {c_out}, {k}x{k}/{s} | {alone * 1e6:.0f} | {onednn * 1e6:.0f} | "
              f"{ours * 1e6:.0f} | {onednn / ours:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
