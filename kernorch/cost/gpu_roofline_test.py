"""The analytic GPU cost: per launch with occupancy, host fallbacks priced with their copies, TF32 only when asked,
and a GPU plan of an attention block that keeps everything on the device."""

from __future__ import annotations

import math

import numpy as np

from kernorch.codegen.backends import choose_backend
from kernorch.codegen.target import GPU_TARGETS
from kernorch.cost.analytic import kernel_bytes
from kernorch.cost.gpu_roofline import GpuCostModel
from kernorch.devtools.mutate import here
from kernorch.ir.graph import Graph, Node
from kernorch.ir.kernel import CandidateKernel, make_kernel
from kernorch.ir.types import TensorType

A100 = GPU_TARGETS["a100"]



def _backend(kernel: CandidateKernel) -> str:
    backend, reason = choose_backend(kernel, "gpu")
    assert backend is not None, reason
    return backend.name


def _single(prim: str, shapes: list[tuple[int, ...]], out: tuple[int, ...], attrs: tuple = (),
            dtype: str = "float32") -> Graph:  # fmt: skip
    graph = Graph(inputs=[f"x{i}" for i in range(len(shapes))], outputs=["y"])
    for i, shape in enumerate(shapes):
        graph.types[f"x{i}"] = TensorType(shape, dtype)
    graph.types["y"] = TensorType(out, dtype)
    graph.nodes = [Node(prim, tuple(graph.inputs), ("y",), attrs)]
    return graph


def test_a_launch_with_fewer_programs_than_sms_reaches_only_their_share_of_the_bandwidth() -> None:
    model = GpuCostModel(A100)
    small, large = (make_kernel(g, (0,), ("y",)) for g in (_single("exp", [(64,)], (64,)),
                                                           _single("exp", [(1 << 24,)], (1 << 24,))))  # fmt: skip
    for kernel in (small, large):
        assert _backend(kernel) == "triton"
    memory_small = model.cost(small) - A100.launch_overhead
    memory_large = model.cost(large) - A100.launch_overhead
    # one program of 64 lanes: 1/108 of the bandwidth; the large one streams at the full bandwidth
    assert memory_small > 50 * kernel_bytes(small) / A100.global_bandwidth
    assert math.isclose(memory_large, kernel_bytes(large) / A100.global_bandwidth, rel_tol=1e-6)


def test_tf32_makes_a_compute_bound_matmul_cheaper_only_when_allowed() -> None:
    graph = _single("matmul", [(2048, 2048), (2048, 2048)], (2048, 2048))
    kernel = make_kernel(graph, (0,), ("y",))
    assert _backend(kernel) == "torch_library"
    ieee, tf32 = GpuCostModel(A100).cost(kernel), GpuCostModel(A100, tf32=True).cost(kernel)
    assert tf32 < ieee / 4
    assert math.isclose(ieee, 2 * 2048**3 / (A100.peak_flops * 0.8) + A100.launch_overhead, rel_tol=1e-6)


def test_a_kernel_only_the_host_runs_pays_its_copies() -> None:
    graph = _single("top_k", [(1, 4096), (1,)], (1, 8), (("axis", 1), ("largest", True), ("sorted", True)))
    graph.constants["x1"] = np.array([8], np.int64)
    graph.types["x1"] = TensorType((1,), "int64")
    graph.inputs = ["x0"]
    graph.types["y_i"] = TensorType((1, 8), "int64")
    graph.nodes = [Node("top_k", ("x0", "x1"), ("y", "y_i"), (("axis", 1), ("largest", True), ("sorted", True)))]
    kernel = make_kernel(graph, (0,), ("y", "y_i"))
    backend, _ = choose_backend(kernel, "gpu")
    assert backend is not None and backend.name == "reference"
    assert GpuCostModel(A100).cost(kernel) > 20e-6  # a synchronisation and two copies: never chosen lightly


def test_a_gpu_plan_of_attention_runs_everything_on_the_device() -> None:
    from kernorch.options import Options
    from kernorch.pipeline import plan_model
    from kernorch.tools.demo_models import self_attention_block

    plan = plan_model(self_attention_block(seq=32, hidden=64), options=Options(cost="analytic", device="h100")).plan
    names = {_backend(kernel) for kernel in plan.kernels}
    assert names <= {"triton", "triton_matmul", "torch_library", "gpu_view"}
    assert "triton" in names and ({"torch_library", "triton_matmul"} & names)


def test_a_depthwise_window_pays_its_taps_at_l2_not_at_global_memory() -> None:
    from kernorch.codegen.gir import rewritten

    graph = _single("conv", [(1, 64, 28, 28), (64, 1, 5, 5)], (1, 64, 28, 28),
                    (("group", 64), ("strides", (1, 1)), ("dilations", (1, 1)), ("pads", (2, 2, 2, 2))))  # fmt: skip
    kernel = make_kernel(graph, (0,), ("y",))
    assert _backend(kernel) == "triton"
    gir = rewritten(kernel, A100)  # the GIR lowered for the GPU Target: every tap a load of its own
    lines = gir.traffic("load") + gir.traffic("store")
    assert lines > 4 * kernel_bytes(kernel)
    memory = GpuCostModel(A100).cost(kernel) - A100.launch_overhead
    assert memory > 1.5 * kernel_bytes(kernel) / A100.global_bandwidth  # the taps' lines count...
    assert memory < lines / A100.global_bandwidth  # ...at L2's bandwidth (the input fits in it), not HBM's


# The mutants of the code this file tests, each a one-line change a real bug could make and that these tests must
# catch (`make mutate`: kernorch/devtools/mutate.py collects them)
MUTANTS = [
    here("gpu cost: occupancy ignored",
         "occupancy = min(1.0, launch.programs / max(self.target.units, 1))",
         "occupancy = 1.0"),
]  # fmt: skip
