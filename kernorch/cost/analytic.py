"""Analytic roofline cost: max(bytes / bandwidth, flops / peak) + a fixed per-kernel overhead.

Bytes are what the kernel reads from and writes to memory (values inside a fused kernel stay in
registers/cache); flops count every primitive the kernel runs, so redundant computation is paid
for. Compute and memory overlap within a kernel, hence the max (the roofline), not the sum.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kernorch.cost.interface import CostModelBase
from kernorch.ir.graph import Graph, Node
from kernorch.ir.kernel import CandidateKernel, make_kernel
from kernorch.ir.primitives import PRIMITIVES, Kind
from kernorch.ir.reference_kernels import stack_layers
from kernorch.ir.types import TensorType
from kernorch.machine import cpu_model, fingerprint, int8_dot_products
from kernorch.options import DEFAULT_THREADS, cache_root
from kernorch.runtime.threads import thread_count
from kernorch.runtime.timing import time_call


@dataclass(frozen=True)
class DeviceSpec:
    name: str
    bandwidth: float  # bytes / s
    peak_flops: float  # fp32 flop / s
    kernel_overhead: float  # s per kernel launch / dispatch
    # bytes / s a generated kernel streams through a 64 MiB buffer with the calibrated threads (caches included, as
    # the kernels see them): the memory roof of a kernel whose operands outgrow L2 (0: not measured)
    stream_bandwidth: float = 0.0


# Public datasheet figures (fp32 non-tensor-core peak, HBM bandwidth), typical launch overhead.
DEVICE_PRESETS = {
    # a CPU plan priced without calibrating this machine (tests, conformance: the same plan on every host)
    "cpu-nominal": DeviceSpec("nominal x86 CPU", 20e9, 2.0e11, 5e-6),
    "v100": DeviceSpec("V100-SXM2", 900e9, 15.7e12, 5e-6),
    "a100": DeviceSpec("A100-SXM4-40GB", 1555e9, 19.5e12, 5e-6),
    "h100": DeviceSpec("H100-SXM5", 3350e9, 67e12, 4e-6),
}

# Rough flop weights of transcendental elementwise primitives relative to an add.
_TRANSCENDENTAL = {"exp": 8, "log": 8, "log1p": 8, "erf": 10, "tanh": 10, "sigmoid": 10, "pow": 10, "sqrt": 4, "div": 4,
                   "reciprocal": 4, "sin": 8, "cos": 8}  # fmt: skip


def _lstm_step_flops(hidden: int, features: int) -> int:
    """One LSTM step of one sequence: the gates' products with h (and with x when `features` > 0, the input
    projection done in the same kernel), plus the cell update's ~40 operations per unit."""
    return 2 * 4 * hidden * (hidden + features) + 40 * hidden


def primitive_flops(graph: Graph, node: Node) -> float:
    out = graph.types[node.outputs[0]]
    kind = PRIMITIVES[node.prim].kind
    if node.prim in ("matmul", "matmul_integer"):
        a = graph.types[node.inputs[0]]
        return 2.0 * out.numel * a.shape[-1]
    if node.prim in ("conv", "conv_integer"):
        w = graph.types[node.inputs[1]]
        return 2.0 * out.numel * w.numel / w.shape[0]
    if node.prim == "conv_transpose":
        x, w = graph.types[node.inputs[0]], graph.types[node.inputs[1]]
        return 2.0 * x.numel * w.numel / w.shape[0]
    if node.prim == "lstm_recurrence":
        dirs, seq, batch, four_h = graph.types[node.inputs[0]].shape
        return float(dirs * seq * batch * _lstm_step_flops(four_h // 4, 0))
    if node.prim == "lstm_stack":  # every layer's scan, and the input projections of the layers above the first
        _, seq, batch, _ = graph.types[node.inputs[0]].shape
        total, features = 0.0, 0
        for index, layer in enumerate(stack_layers(node.inputs)):
            hidden = graph.types[layer[1 if index == 0 else 2]].shape[2]  # packed R [D, H/U, H, 4, U]
            total += seq * batch * _lstm_step_flops(hidden, features)
            features = hidden
        return total
    if kind == Kind.ELEMENTWISE:
        return float(out.numel * _TRANSCENDENTAL.get(node.prim, 1))
    if kind == Kind.REDUCE:
        if node.prim.startswith("window_"):
            return float(out.numel * int(np.prod(node.attr("kernel"))))
        return float(graph.types[node.inputs[0]].numel)
    if node.prim == "resize" and node.attr("mode") != "nearest":
        return float(out.numel * 4 * graph.types[node.inputs[0]].rank)
    return 0.0


def kernel_bytes(candidate: CandidateKernel) -> float:
    """Bytes read (each input once; a value only sliced is read only where sliced) plus bytes written."""
    graph = candidate.graph
    inside = candidate.primitives
    total = 0.0
    for value in candidate.inputs:
        readers = [n for n in inside if value in n.inputs]
        if readers and all(n.prim == "slice" for n in readers):
            total += sum(graph.types[n.outputs[0]].nbytes for n in readers)
        else:
            total += graph.types[value].nbytes
    total += sum(graph.types[value].nbytes for value in candidate.outputs)
    return total


# bf16 multiply-adds per float32 one: AVX512-BF16's dot product does two per lane; oneDNN's bf16 matmul ran at 2.5x
# its float32 rate on an AMX machine (512x1024x1024), a 3x3 conv at 1.9x. The roofline takes the lower bound.
BF16_RATE = 2.0
# int8 multiply-adds per float32 one: a VNNI dot product does four per lane (bytes, int32 sums). Without VNNI the
# exact path is AVX2's vpmaddwd (two int16 products a lane, native/int8_matmul.py): bert_mini's int8 matmuls ran at
# 1.2x the fp32 peak in place on Zen 3 (2 threads)
INT8_RATE = 4.0
INT8_RATE_WITHOUT_VNNI = 1.0


def int8_rate() -> float:
    """This CPU's int8 multiply-adds per float32 one."""
    return INT8_RATE if int8_dot_products() else INT8_RATE_WITHOUT_VNNI


# an int8 convolution on NCHW buffers: no int8 kernel takes them (oneDNN 3.2 only by its reference kernel, ~1000x
# slower), so it runs by kernorch's reference implementation, a float64 convolution called from Python
REFERENCE_RATE = 0.05
REFERENCE_CALL = 1e-4  # seconds: the call, its conversions to float64 and back


def _by_reference(node: Node) -> bool:
    return node.prim == "conv_integer" and not node.attr("channels_last", False)


def _rate(node: Node) -> float:
    """How many multiply-adds of this primitive's kind the CPU does per float32 one."""
    if _by_reference(node):
        return REFERENCE_RATE
    if node.prim in ("matmul_integer", "conv_integer"):
        return int8_rate()
    return BF16_RATE if node.attr("precision") == "bf16" else 1.0


@dataclass
class AnalyticCostModel(CostModelBase):
    device: DeviceSpec
    name: str = "analytic"

    def cost(self, candidate: CandidateKernel) -> float:
        flops = sum(primitive_flops(candidate.graph, node) / _rate(node) for node in candidate.primitives)
        seconds = max(kernel_bytes(candidate) / self.device.bandwidth, flops / self.device.peak_flops)
        return seconds + self.device.kernel_overhead + REFERENCE_CALL * sum(map(_by_reference, candidate.primitives))


CALIBRATION_VERSION = 4  # 3: one entry per thread count (one was re-measured at every switch); 4: stream bandwidth


def calibrate_this_machine(cache_dir: Path | None = None, threads: int = DEFAULT_THREADS,
                           refresh: bool = False) -> DeviceSpec:  # fmt: skip
    """Measure memory bandwidth (large copy), fp32 peak (a 1024³ oneDNN matmul with packed weights and
    `threads` threads, the library kernels' own path), the dispatch cost of one tiny generated kernel and the
    rate a generated kernel streams 64 MiB with `threads` threads; best of several runs, since these are the
    machine's peaks.

    Takes about a second; the result is cached per machine fingerprint and thread count. `refresh` measures
    again and replaces the cached entry: a calibration taken while the machine was busy (a test suite, a
    compile) under-states its peaks for as long as it is cached, so a measurement report takes its own.
    """
    path = cache_root(cache_dir) / "calibration.json"
    machine = fingerprint()
    entries: dict[str, Any] = {}
    try:
        cached = json.loads(path.read_text())
        if cached.get("fingerprint") == machine and cached.get("version") == CALIBRATION_VERSION:
            entries = dict(cached["devices"])
            if not refresh and str(threads) in entries:
                return DeviceSpec(**entries[str(threads)])
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        entries = {}  # missing or corrupt: measure again

    device = _measure_device(cache_dir, threads)
    entries[str(threads)] = asdict(device)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
        partial.write_text(json.dumps({"fingerprint": machine, "version": CALIBRATION_VERSION,
                                       "devices": entries}))  # fmt: skip
        os.replace(partial, path)  # atomic: parallel processes calibrating at once never leave half a file
    except OSError:
        pass  # a cache: without a writable directory, calibrate again next time
    return device


def _measure_device(cache_dir: Path | None, threads: int) -> DeviceSpec:
    source = np.ones(16 * 1024 * 1024, dtype=np.float32)  # 64 MiB: past most caches (not a 300 MiB L3)
    target = np.empty_like(source)
    bandwidth = 2 * source.nbytes / time_call(lambda: np.copyto(target, source), runs=5).best
    size = 1024
    matmul = _single_kernel("matmul", (size, size), constant_b=True, cache_dir=cache_dir, threads=threads)
    stream = _single_kernel("relu", source.shape, cache_dir=cache_dir, threads=threads)
    with thread_count(threads):
        peak = 2 * size**3 / time_call(matmul, runs=10, warmup=2).best
        overhead = max(time_call(_single_kernel("relu", (16,), cache_dir=cache_dir, threads=threads),
                                 runs=1000).median, 1e-7)  # fmt: skip
        streamed = 2 * source.nbytes / time_call(stream, runs=5, warmup=1).best  # read once, written once
    return DeviceSpec(f"this machine ({cpu_model()})", bandwidth, peak, overhead, streamed)


def _single_kernel(prim: str, shape: tuple[int, ...], constant_b: bool = False, cache_dir: Path | None = None,
                   threads: int = DEFAULT_THREADS) -> Callable[[], Any]:  # fmt: skip
    """A one-kernel plan of `prim` on random float32 data, compiled like any plan; returns its launcher."""
    from kernorch.runtime.executor import PlanExecutor

    rng = np.random.default_rng(0)
    graph = Graph(inputs=["a"], outputs=["c"], name=f"calibrate-{prim}")
    graph.types = {"a": TensorType(shape, "float32"), "c": TensorType(shape, "float32")}
    inputs: tuple[str, ...] = ("a",)
    if constant_b:
        graph.constants["b"] = rng.standard_normal(shape).astype(np.float32)
        graph.types["b"] = TensorType(shape, "float32")
        inputs = ("a", "b")
    graph.nodes = [Node(prim, inputs, ("c",))]
    executor = PlanExecutor(graph, [make_kernel(graph, (0,), ("c",))], threads, cache_dir)
    executor.buffers["a"][...] = rng.standard_normal(shape)
    (launch,) = executor.steps
    launch.keep_alive = executor  # type: ignore[attr-defined]
    return launch


def device_by_name(name: str, cache_dir: Path | None = None, threads: int = DEFAULT_THREADS) -> DeviceSpec:
    """The roofline of a CPU plan ("cpu": this machine, calibrated) or of a GPU preset."""
    if name == "cpu":
        return calibrate_this_machine(cache_dir, threads)
    if name not in DEVICE_PRESETS:
        raise ValueError(f"unknown device '{name}' (choose cpu, {', '.join(DEVICE_PRESETS)})")
    return DEVICE_PRESETS[name]
