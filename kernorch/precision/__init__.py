"""The precision stage: which linear primitives multiply in bfloat16 (`Options(precision="bf16")`).

Between layout and orchestrate, like the layout stage it follows. A precision is a decision per primitive,
made against the cost model: each float32 matmul, conv and conv_transpose is priced alone as it is and with
`precision="bf16"` (operands rounded to bfloat16, sums and output float32: oneDNN's AMX / AVX512-BF16
kernels), and computes in bf16 where that is cheaper. Afterwards a bf16 primitive is just a linear primitive
with the attribute: the orchestrator fuses it like any other, the profile database keys its kernels apart
(their source differs), `kernorch explain` names it, and its reference rounds the operands the same way, so
compiled bf16 kernels are tested as tightly as float32 ones.

What stays float32, and why, is the written policy below (`POLICY`); `kernorch explain` prints it.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

from kernorch.cost.model import CostModel
from kernorch.ir.graph import Graph, Node
from kernorch.ir.kernel import CandidateKernel, make_kernel
from kernorch.ir.primitives import PRIMITIVES, Kind
from kernorch.machine import bf16_supported, check_bf16_supported

__all__ = ["POLICY", "PrecisionReport", "bf16_supported", "check_bf16_supported", "choose_precision", "policy_lines",
           "with_precision"]

PRECISIONS = ("fp32", "bf16")  # Options.precision
BF16_PRIMS = ("matmul", "conv", "conv_transpose")

# primitive (or kind) -> (precision in bf16 mode, why)
POLICY: dict[str, tuple[str, str]] = {
    "matmul, conv, conv_transpose": (
        "bf16 where the cost model finds it faster",
        "compute-bound: AVX512-BF16 multiplies bfloat16 pairs at twice the float32 rate, AMX tiles at more (oneDNN's "
        "bf16 matmuls ran 2.5-2.9x its float32 ones here); the products are summed and written in float32, so the "
        "rounding is once per operand (8 significant bits), not once per sum"),
    "reductions (reduce_*, window_*), softmax and normalisation statistics": (
        "fp32",
        "they sum many terms (a mean over 768 channels, a softmax's denominator); an 8-bit mantissa would lose "
        "the small terms, and they are memory-bound, so bf16 arithmetic would save nothing"),
    "lstm_recurrence": (
        "fp32",
        "its hidden and cell state feed back every step: a rounding error would compound over the sequence "
        "(its input projection, a matmul, may be bf16)"),
    "elementwise and layout primitives, values between kernels": (
        "fp32",
        "values are stored as float32 between kernels in this version: a bf16 linear kernel converts its operands "
        "inside its own call (a reorder into a buffer it owns; constant weights once, when they are packed)"),
}  # fmt: skip


@dataclass(frozen=True)
class PrecisionReport:
    precision: str  # "fp32" or "bf16"
    linear: int  # float32 linear primitives
    bf16: int  # of them, computing in bf16
    cost_fp32: float  # the linear primitives alone, seconds, all float32
    cost_chosen: float  # the same with the chosen precisions
    seconds: float

    def summary(self) -> str:
        if self.precision == "fp32":
            return "precision fp32: every primitive computes in float32"
        if math.isnan(self.cost_fp32):
            return f"precision bf16: all {self.bf16} linear primitives multiply in bfloat16 (no cost model asked)"
        return (f"precision bf16: {self.bf16} of {self.linear} linear primitives multiply in bfloat16 (float32 "
                f"sums); alone they cost {self.cost_chosen * 1e3:.3f} ms vs {self.cost_fp32 * 1e3:.3f} ms in "
                f"float32; everything else float32 ({self.seconds:.1f} s)")

    def to_json(self) -> dict[str, Any]:
        return dict(vars(self))


def policy_lines() -> list[str]:
    return [f"  {what}: {precision} — {why}" for what, (precision, why) in POLICY.items()]


def candidate_for_bf16(graph: Graph, node: Node) -> bool:
    """A float32 linear primitive not yet given a precision."""
    return (node.prim in BF16_PRIMS and PRIMITIVES[node.prim].kind == Kind.LINEAR and "precision" not in node.attr_dict
            and all(graph.types[v].dtype == "float32" for v in (*node.inputs, *node.outputs)))  # fmt: skip


def with_precision(node: Node, precision: str) -> Node:
    attrs = {**node.attr_dict, "precision": precision}
    return Node(node.prim, node.inputs, node.outputs, tuple(sorted(attrs.items())), node.origin)


def _alone(graph: Graph, node: Node) -> CandidateKernel:
    """The node as a kernel of its own, on a graph holding it alone (its operands inputs or constants)."""
    mini = Graph(inputs=[v for v in dict.fromkeys(node.inputs) if v not in graph.constants],
                 outputs=list(node.outputs), name="precision")  # fmt: skip
    mini.types = {v: graph.types[v] for v in (*node.inputs, *node.outputs)}
    mini.constants = {v: graph.constants[v] for v in node.inputs if v in graph.constants}
    mini.nodes = [node]
    return make_kernel(mini, (0,), tuple(node.outputs))


def choose_precision(graph: Graph, cost_model: CostModel | None,
                     precision: str = "fp32") -> tuple[Graph, PrecisionReport]:  # fmt: skip
    """The graph with each linear primitive in its chosen precision, and what was decided. Without a cost model
    (`kernorch check`'s reference run) every candidate is bf16: the mode's largest error."""
    start = time.perf_counter()
    sites = [i for i, node in enumerate(graph.nodes) if candidate_for_bf16(graph, node)]
    if precision == "fp32" or not sites:
        return graph, PrecisionReport(precision, len(sites), 0, 0.0, 0.0, time.perf_counter() - start)
    if cost_model is None:
        marked = graph.copy()
        for i in sites:
            marked.nodes[i] = with_precision(graph.nodes[i], "bf16")
        return marked, PrecisionReport(precision, len(sites), len(sites), math.nan, math.nan,
                                       time.perf_counter() - start)  # fmt: skip
    pairs = {i: (_alone(graph, graph.nodes[i]), _alone(graph, with_precision(graph.nodes[i], "bf16"))) for i in sites}
    prepare = getattr(cost_model, "prepare", None)
    if prepare is not None:  # a measuring cost model times them in one batch
        prepare([k for pair in pairs.values() for k in pair])
    chosen = graph.copy()
    cost_fp32 = cost_chosen = 0.0
    count = 0
    for i, (fp32, bf16) in pairs.items():
        fp32_cost, bf16_cost = cost_model.cost(fp32), cost_model.cost(bf16)
        if bf16_cost < fp32_cost:
            chosen.nodes[i] = with_precision(graph.nodes[i], "bf16")
            count += 1
        if math.isfinite(fp32_cost):  # a primitive only a fallback runs is priced by neither
            cost_fp32 += fp32_cost
            cost_chosen += min(fp32_cost, bf16_cost)
    return chosen, PrecisionReport(precision, len(sites), count, cost_fp32, cost_chosen, time.perf_counter() - start)
