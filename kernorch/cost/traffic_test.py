"""Activation traffic: what it counts, what it adds to a profiled cost, and the fusion choice it tips."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kernorch.cost.bandwidth import MemoryLevel, MemoryLevels
from kernorch.cost.profile import ProfileDatabase, ProfiledCostModel
from kernorch.cost.traffic import DRAM_SHARE, ActivationTraffic, activation_bytes
from kernorch.devtools.mutate import here
from kernorch.ir.graph import Graph, Node
from kernorch.ir.kernel import make_kernel
from kernorch.ir.types import TensorType

L2, L3, DRAM = 8e10, 6e10, 1.2e10  # bytes / s
LEVELS = MemoryLevels((MemoryLevel("L2", 1 << 20, L2), MemoryLevel("L3", 16 << 20, L3),
                       MemoryLevel("DRAM", 1 << 62, DRAM)), 2e-6)  # fmt: skip


def conv_relu(size: int = 12, channels: int = 16) -> Graph:
    """x [1, C, H, W] -> 3x3 conv (constant weights) -> y -> relu -> z."""
    rng = np.random.default_rng(0)
    graph = Graph(inputs=["x"], outputs=["z"], name="conv_relu")
    graph.constants = {"w": rng.standard_normal((channels, channels, 3, 3)).astype(np.float32)}
    activation = TensorType((1, channels, size, size), "float32")
    graph.types = {"x": activation, "y": activation, "z": activation, "w": TensorType((channels, channels, 3, 3),
                                                                                      "float32")}  # fmt: skip
    attrs = (("dilations", (1, 1)), ("group", 1), ("kernel_shape", (3, 3)), ("pads", (1, 1, 1, 1)),
             ("strides", (1, 1)))  # fmt: skip
    graph.nodes = [Node("conv", ("x", "w"), ("y",), attrs), Node("relu", ("y",), ("z",))]
    return graph


def test_activations_are_the_non_constant_values_read_and_written() -> None:
    graph = conv_relu(size=12, channels=16)
    one = 16 * 12 * 12 * 4
    assert activation_bytes(make_kernel(graph, (0,), ("y",))) == 2 * one  # x and y; not the weights
    assert activation_bytes(make_kernel(graph, (1,), ("z",))) == 2 * one
    assert activation_bytes(make_kernel(graph, (0, 1), ("z",))) == 2 * one  # y stays inside


@pytest.mark.parametrize(("moved", "hot"), [(64 << 10, L2), (4 << 20, L3), (64 << 20, DRAM)])
def test_each_byte_costs_a_share_of_dram_over_the_level_it_was_hot_in(moved: int, hot: float) -> None:
    graph = Graph(inputs=["x"], outputs=["y"], name="stream")
    graph.types = {name: TensorType((moved // 8,), "float32") for name in ("x", "y")}
    graph.nodes = [Node("relu", ("x",), ("y",))]
    seconds = ActivationTraffic(LEVELS).seconds(make_kernel(graph, (0,), ("y",)))
    assert seconds == pytest.approx(DRAM_SHARE * moved * (1 / DRAM - 1 / hot), abs=1e-15)
    assert (seconds > 0) == (hot != DRAM)  # a working set that streamed from DRAM isolated costs what it did


def test_a_kernel_without_activations_costs_its_profile() -> None:
    graph = Graph(inputs=[], outputs=["y"], name="constant")
    graph.constants = {"c": np.ones(4, np.float32)}
    graph.types = {"c": TensorType((4,), "float32"), "y": TensorType((4,), "float32")}
    graph.nodes = [Node("relu", ("c",), ("y",))]
    assert ActivationTraffic(LEVELS).seconds(make_kernel(graph, (0,), ("y",))) == pytest.approx(
        DRAM_SHARE * 16 * (1 / DRAM - 1 / L2))  # its output only
    graph.outputs, graph.types["y"] = [], TensorType((0,), "float32")
    assert ActivationTraffic(LEVELS).seconds(make_kernel(graph, (0,), ("y",))) == 0.0


def test_the_profiled_cost_adds_the_traffic_and_tips_a_close_call_to_the_fused_kernel(tmp_path: Path) -> None:
    """Fused conv + relu against conv then relu apart: the apart pair pays for y twice more (written, read back),
    so its cost rises by that much more than the fused kernel's."""
    graph = conv_relu()
    conv, relu, fused = (make_kernel(graph, nodes, outs) for nodes, outs in (((0,), ("y",)), ((1,), ("z",)),
                                                                            ((0, 1), ("z",))))  # fmt: skip
    model = ProfiledCostModel(ProfileDatabase(tmp_path / "profiles.sqlite"))
    model.prepare([conv, relu, fused])
    isolated = {kernel.key: model.cost(kernel) for kernel in (conv, relu, fused)}  # measured once, remembered
    traffic = ActivationTraffic(LEVELS)
    model.traffic = traffic
    for kernel in (conv, relu, fused):
        assert model.cost(kernel) == pytest.approx(isolated[kernel.key] + traffic.seconds(kernel), rel=1e-12)
        assert traffic.seconds(kernel) > 0
    apart = model.cost(conv) + model.cost(relu) - isolated[conv.key] - isolated[relu.key]
    y = graph.types["y"].nbytes
    assert apart - (model.cost(fused) - isolated[fused.key]) == pytest.approx(
        2 * y * DRAM_SHARE * (1 / DRAM - 1 / L2), rel=1e-9)  # fmt: skip


def test_a_planned_model_prices_activation_traffic() -> None:
    from kernorch.options import Options
    from kernorch.pipeline import make_cost_model

    model = make_cost_model(Options(cost="profile", threads=1))
    assert isinstance(model, ProfiledCostModel) and isinstance(model.traffic, ActivationTraffic)


MUTANTS = [
    here("constants charged as activations", "values if v not in graph.constants and", "values if True and"),
    here("traffic not added to the profile", "return measured + self.traffic.seconds(candidate) if self.traffic",
         "return measured + 0 if self.traffic", file="kernorch/cost/profile.py"),
    here("the hot level ignored", "max(0.0, 1 / dram.bandwidth - 1 / hot.bandwidth)", "1 / dram.bandwidth"),
]
