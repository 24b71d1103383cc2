"""Roofline arithmetic on hand-computable kernels, presets, and the calibration cache."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kernorch.cost.analytic import DEVICE_PRESETS, AnalyticCostModel, DeviceSpec, calibrate_this_machine
from kernorch.ir.graph import Graph, Node
from kernorch.ir.kernel import make_kernel
from kernorch.ir.types import TensorType
from kernorch.options import DEFAULT_THREADS

DEVICE = DeviceSpec("test", bandwidth=1e9, peak_flops=1e12, kernel_overhead=1e-6)


def chain() -> Graph:
    t = TensorType((1000,), "float32")
    graph = Graph(inputs=["x"], outputs=["b"], types={"x": t, "a": t, "b": t})
    graph.nodes = [Node("relu", ("x",), ("a",)), Node("exp", ("a",), ("b",))]
    return graph


def test_fusion_saves_memory_traffic() -> None:
    graph = chain()
    model = AnalyticCostModel(DEVICE)
    separate = model.cost(make_kernel(graph, (0,), ("a",))) + model.cost(make_kernel(graph, (1,), ("b",)))
    fused = model.cost(make_kernel(graph, (0, 1), ("b",)))
    # separate: 2 kernels x 8000 bytes at 1 GB/s; fused: one kernel moving 8000 bytes.
    assert separate == pytest.approx(2 * (8000 / 1e9 + 1e-6))
    assert fused == pytest.approx(8000 / 1e9 + 1e-6)
    multi_output = model.cost(make_kernel(graph, (0, 1), ("b", "a")))
    assert multi_output == pytest.approx(12000 / 1e9 + 1e-6)


def test_matmul_is_compute_bound() -> None:
    a, b, c = TensorType((64, 64), "float32"), TensorType((64, 64), "float32"), TensorType((64, 64), "float32")
    graph = Graph(inputs=["a", "b"], outputs=["c"], types={"a": a, "b": b, "c": c})
    graph.nodes = [Node("matmul", ("a", "b"), ("c",))]
    compute_bound = DeviceSpec("slow alu", bandwidth=1e12, peak_flops=1e9, kernel_overhead=1e-6)
    cost = AnalyticCostModel(compute_bound).cost(make_kernel(graph, (0,), ("c",)))
    assert cost == pytest.approx(2 * 64**3 / 1e9 + 1e-6)


def test_presets_drive_the_roofline() -> None:
    """The preset chosen changes the estimate the way its figures say: a memory-bound kernel runs
    faster with more bandwidth, a compute-bound one with more flops."""
    graph = Graph(inputs=["a", "b"], outputs=["c"])
    graph.types = {v: TensorType((512, 512), "float32") for v in "abc"}
    graph.nodes = [Node("matmul", ("a", "b"), ("c",))]
    compute = make_kernel(graph, (0,), ("c",))
    elementwise = Graph(inputs=["x"], outputs=["y"])
    elementwise.types = {v: TensorType((1 << 20,), "float32") for v in "xy"}
    elementwise.nodes = [Node("relu", ("x",), ("y",))]
    memory = make_kernel(elementwise, (0,), ("y",))
    v100, a100, h100 = (AnalyticCostModel(DEVICE_PRESETS[name]) for name in ("v100", "a100", "h100"))
    assert v100.cost(memory) == pytest.approx(8 * 2**20 / 900e9 + 5e-6)
    assert a100.cost(memory) < v100.cost(memory)
    assert h100.cost(compute) < a100.cost(compute) < v100.cost(compute)


def test_calibration_is_cached_and_survives_corruption(tmp_path: Path) -> None:
    first = calibrate_this_machine(tmp_path)
    assert first.bandwidth > 1e8 and first.peak_flops > 1e8 and first.kernel_overhead > 0
    cached = json.loads((tmp_path / "calibration.json").read_text())
    assert cached["devices"][str(DEFAULT_THREADS)]["bandwidth"] == first.bandwidth
    assert calibrate_this_machine(tmp_path) == first  # read back, not re-measured
    (tmp_path / "calibration.json").write_text("{not json")
    assert calibrate_this_machine(tmp_path).bandwidth > 1e8


def test_calibration_keeps_one_entry_per_thread_count(tmp_path: Path) -> None:
    # one shared entry was re-measured at every switch of thread count, often while a test suite ran
    one, two = calibrate_this_machine(tmp_path, threads=1), calibrate_this_machine(tmp_path, threads=2)
    assert calibrate_this_machine(tmp_path, threads=1) == one
    assert calibrate_this_machine(tmp_path, threads=2) == two
    assert sorted(json.loads((tmp_path / "calibration.json").read_text())["devices"]) == ["1", "2"]
    again = calibrate_this_machine(tmp_path, threads=2, refresh=True)
    assert again != two  # measured again (its timings differ), and stored
    assert calibrate_this_machine(tmp_path, threads=2) == again
    assert calibrate_this_machine(tmp_path, threads=1) == one
    assert not list(tmp_path.glob("*.partial"))
