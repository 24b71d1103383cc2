"""Analytic roofline cost: max(bytes / bandwidth, flops / peak) + a fixed per-kernel overhead.

Bytes are what the kernel reads from and writes to memory (values inside a fused kernel stay in
registers/cache); flops count every primitive the kernel runs, so redundant computation is paid
for. Compute and memory overlap within a kernel, hence the max (the roofline), not the sum.
"""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from kernorch.ir.graph import Graph, Node
from kernorch.ir.primitives import PRIMITIVES, Kind
from kernorch.orchestrate.kernel import CandidateKernel


@dataclass(frozen=True)
class DeviceSpec:
    name: str
    bandwidth: float  # bytes / s
    peak_flops: float  # fp32 flop / s
    kernel_overhead: float  # s per kernel launch / dispatch


# Public datasheet figures (fp32 non-tensor-core peak, HBM bandwidth), typical launch overhead.
DEVICE_PRESETS = {
    "v100": DeviceSpec("V100-SXM2", 900e9, 15.7e12, 5e-6),
    "a100": DeviceSpec("A100-SXM4-40GB", 1555e9, 19.5e12, 5e-6),
    "h100": DeviceSpec("H100-SXM5", 3350e9, 67e12, 4e-6),
}

# Rough flop weights of transcendental elementwise primitives relative to an add.
_TRANSCENDENTAL = {"exp": 8, "log": 8, "erf": 10, "tanh": 10, "sigmoid": 10, "pow": 10, "sqrt": 4, "div": 4,
                   "reciprocal": 4, "sin": 8, "cos": 8}  # fmt: skip


def primitive_flops(graph: Graph, node: Node) -> float:
    out = graph.types[node.outputs[0]]
    kind = PRIMITIVES[node.prim].kind
    if node.prim == "matmul":
        a = graph.types[node.inputs[0]]
        return 2.0 * out.numel * a.shape[-1]
    if node.prim == "conv":
        w = graph.types[node.inputs[1]]
        return 2.0 * out.numel * w.numel / w.shape[0]
    if node.prim == "conv_transpose":
        x, w = graph.types[node.inputs[0]], graph.types[node.inputs[1]]
        return 2.0 * x.numel * w.numel / w.shape[0]
    if node.prim == "lstm_recurrence":
        dirs, seq, batch, four_h = graph.types[node.inputs[0]].shape
        hidden = four_h // 4
        return float(dirs * seq * batch * (2 * four_h * hidden + 40 * hidden))
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


@dataclass
class AnalyticCostModel:
    device: DeviceSpec
    name: str = "analytic"

    def cost(self, candidate: CandidateKernel) -> float:
        flops = sum(primitive_flops(candidate.graph, node) for node in candidate.primitives)
        seconds = max(kernel_bytes(candidate) / self.device.bandwidth, flops / self.device.peak_flops)
        return seconds + self.device.kernel_overhead


def _fingerprint() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}|{os.cpu_count()}"


def calibrate_this_machine(cache_dir: Path | None = None, threads: int = 2) -> DeviceSpec:
    """Measure memory bandwidth (large copy), fp32 peak (torch matmul) and a tiny-op dispatch cost.

    Takes about a second; the result is cached per machine fingerprint.
    """
    root = cache_dir or Path(os.environ.get("KERNORCH_CACHE") or Path.home() / ".cache" / "kernorch")
    fingerprint = _fingerprint()
    path = root / "calibration.json"
    try:
        cached = json.loads(path.read_text())
        if cached.get("fingerprint") == fingerprint and cached.get("threads") == threads:
            return DeviceSpec(**cached["device"])
    except (OSError, ValueError, TypeError, KeyError):
        pass  # missing or corrupt: measure again

    import torch

    torch.set_num_threads(threads)
    source = np.ones(16 * 1024 * 1024, dtype=np.float32)  # 64 MiB, far beyond the caches
    target = np.empty_like(source)
    copies = []
    for _ in range(5):
        start = time.perf_counter()
        np.copyto(target, source)
        copies.append(time.perf_counter() - start)
    bandwidth = 2 * source.nbytes / min(copies)
    a = torch.randn(1024, 1024)
    b = torch.randn(1024, 1024)
    torch.matmul(a, b)
    products = []
    for _ in range(5):
        start = time.perf_counter()
        torch.matmul(a, b)
        products.append(time.perf_counter() - start)
    peak = 2 * 1024**3 / min(products)
    tiny_in, tiny_out = np.ones(16, np.float32), np.empty(16, np.float32)
    start = time.perf_counter()
    for _ in range(1000):
        np.add(tiny_in, tiny_in, out=tiny_out)
    overhead = max((time.perf_counter() - start) / 1000, 1e-6)
    device = DeviceSpec(f"this machine ({fingerprint.split('|')[0]})", bandwidth, peak, overhead)
    try:
        root.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"fingerprint": fingerprint, "threads": threads, "device": asdict(device)}))
    except OSError:
        pass
    return device


def device_by_name(name: str) -> DeviceSpec:
    if name == "cpu":
        return calibrate_this_machine()
    if name not in DEVICE_PRESETS:
        raise ValueError(f"unknown device '{name}' (choose cpu, {', '.join(DEVICE_PRESETS)})")
    return DEVICE_PRESETS[name]
