"""The precision stage: which linear primitives multiply in bfloat16 (`Options(precision="bf16")`).

Between layout and orchestrate, like the layout stage it follows. A precision is a decision per primitive,
made against the cost model: each float32 matmul, conv and conv_transpose is priced alone as it is and with
`precision="bf16"` (operands rounded to bfloat16, sums and output float32: oneDNN's AMX / AVX512-BF16
kernels; an operand a memory-bound kernel computes read as the bfloat16 that kernel would store, `_stored_bf16`),
and computes in bf16 where that is cheaper. Afterwards a bf16 primitive is just a linear primitive
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

from kernorch.cost.interface import CostModel
from kernorch.ir.graph import Graph, Node, eliminate_dead_nodes
from kernorch.ir.kernel import CandidateKernel, make_kernel
from kernorch.ir.patterns import attention_spans
from kernorch.ir.primitives import PRIMITIVES, STRIDED_VIEW_PRIMS, Kind
from kernorch.ir.strided import strided_view
from kernorch.ir.types import TensorType
from kernorch.machine import bf16_supported, check_bf16_supported, isa_flags

__all__ = ["POLICY", "PrecisionReport", "bf16_supported", "check_bf16_supported", "choose_precision",
           "kernel_precision", "policy_lines", "with_conversions", "with_precision"]

PRECISIONS = ("fp32", "bf16")  # Options.precision
BF16_PRIMS = ("matmul", "conv", "conv_transpose")
MEMORY_BOUND_KINDS = (Kind.ELEMENTWISE, Kind.REDUCE, Kind.LAYOUT)  # generated C, which can store bfloat16

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
    "a bf16 primitive's operands": (
        "bf16 storage",
        "each non-constant operand is read through a cast to bfloat16 placed before it: the BLP fuses that cast "
        "into the kernel producing the operand (it stores bfloat16, half the bytes, rounded as the reference "
        "rounds) or into the call (a reorder into a buffer the call owns), whichever is measured cheaper; "
        "constant weights are converted once, when they are packed"),
    "elementwise and layout primitives, other values between kernels": (
        "fp32",
        "they compute in float32, and a bf16 primitive's output is float32 unless it is another bf16 primitive's "
        "operand (then its call may write it as bfloat16): what else reads it (a residual add, a normalisation) "
        "keeps float32's precision"),
}  # fmt: skip


@dataclass(frozen=True)
class PrecisionReport:
    precision: str  # "fp32" or "bf16"
    linear: int  # float32 linear primitives
    bf16: int  # of them, computing in bf16
    cost_fp32: float  # the linear primitives alone, seconds, all float32
    cost_chosen: float  # the same with the chosen precisions
    seconds: float
    conversions: int = 0  # casts to bfloat16 placed before bf16 operands (with_conversions)

    def summary(self) -> str:
        if self.precision == "fp32":
            return "precision fp32: every primitive computes in float32"
        if math.isnan(self.cost_fp32):
            return f"precision bf16: all {self.bf16} linear primitives multiply in bfloat16 (no cost model asked)"
        return (f"precision bf16: {self.bf16} of {self.linear} linear primitives multiply in bfloat16 (float32 "
                f"sums); alone they cost {self.cost_chosen * 1e3:.3f} ms vs {self.cost_fp32 * 1e3:.3f} ms in "
                f"float32; {self.conversions} operand(s) converted to bfloat16 where the plan chose; everything "
                f"else float32 ({self.seconds:.1f} s)")

    def to_json(self) -> dict[str, Any]:
        return dict(vars(self))


def policy_lines() -> list[str]:
    return [f"  {what}: {precision} — {why}" for what, (precision, why) in POLICY.items()]


def candidate_for_bf16(graph: Graph, node: Node) -> bool:
    """A float32 linear primitive not yet given a precision, nor one whose sums must stay exact integers (an integer
    convolution computed in float32: fission/rules/integer_linear.py)."""
    return (node.prim in BF16_PRIMS and PRIMITIVES[node.prim].kind == Kind.LINEAR and "precision" not in node.attr_dict
            and not node.attr("exact_sums")
            and all(graph.types[v].dtype == "float32" for v in (*node.inputs, *node.outputs)))  # fmt: skip


def with_precision(node: Node, precision: str) -> Node:
    attrs = {**node.attr_dict, "precision": precision}
    return Node(node.prim, node.inputs, node.outputs, tuple(sorted(attrs.items())), node.origin)


def with_conversions(graph: Graph) -> Graph:
    """The graph with each bf16 linear primitive's non-constant float32 operand read through a cast to bfloat16
    (one cast per value, shared by its bf16 readers): a value of its own, so the orchestrator decides where the
    conversion runs — fused into the kernel producing the value (generated C stores bfloat16; a library call
    writes a bfloat16 destination) or into the reading call (a reorder on every run).

    A matmul operand that is a strided view (transposes, reshapes, slices, splits: attention's Q, K and V are
    views of one projection) is converted before its views, which are repeated on the bfloat16 value: the
    projection then writes bfloat16 once, and the views are read through strides as before."""
    converted: dict[str, str] = {}  # float32 value -> its bfloat16 twin
    producers = {out: i for i, node in enumerate(graph.nodes) for out in node.outputs}
    chains = _bf16_only_chains(graph, producers)
    nodes: list[Node] = []
    out = graph.copy()

    def cast(value: str, origin: str) -> str:
        if value not in converted:
            converted[value] = name = _fresh(out, f"{value}.bf16")
            out.types[name] = TensorType(graph.types[value].shape, "bfloat16")
            nodes.append(Node("cast", (value,), (name,), (("to", "bfloat16"),), origin))
        return converted[value]

    def twin(value: str, origin: str, views: bool) -> str:
        """The bfloat16 twin of `value`: a cast of it, or (`views`) of the start of its view chain, the chain
        repeated on the bfloat16 values (a chain shared by several operands, once)."""
        chain = chains.get(value, []) if views and value not in converted else []
        if not chain:
            return cast(value, origin)
        cast(graph.nodes[chain[-1]].inputs[0], origin)
        for i in reversed(chain):
            view = graph.nodes[i]
            if view.outputs[0] in converted:
                continue
            outputs = tuple(_fresh(out, f"{v}.bf16") for v in view.outputs)
            for original, name in zip(view.outputs, outputs, strict=True):
                out.types[name] = TensorType(graph.types[original].shape, "bfloat16")
                converted[original] = name
            inputs = (converted[view.inputs[0]], *view.inputs[1:])
            nodes.append(Node(view.prim, inputs, outputs, view.attrs, view.origin))
        return converted[value]

    for node in graph.nodes:
        if node.attr("precision", "f32") == "bf16":
            inputs = tuple(twin(v, node.origin, node.prim == "matmul")
                           if v not in graph.constants and graph.types[v].dtype == "float32" else v
                           for v in node.inputs)  # fmt: skip
            node = Node(node.prim, inputs, node.outputs, node.attrs, node.origin)
        nodes.append(node)
    out.nodes = nodes
    return eliminate_dead_nodes(out)


def _bf16_only_chains(graph: Graph, producers: dict[str, int]) -> dict[str, list[int]]:
    """bf16 matmul operand -> its view chain (`_view_chain`), for the chains whose every value is read only by
    other such chains or by bf16 linear primitives: repeated on bfloat16, they leave no float32 reader behind
    (attention's Q scaled after the split that also gives K and V keeps the float32 chain: each operand is then
    converted after its views instead)."""
    bf16 = {i for i, node in enumerate(graph.nodes) if node.attr("precision", "f32") == "bf16"}
    chains = {value: _view_chain(graph, producers, value) for i in bf16 if graph.nodes[i].prim == "matmul"
              for value in graph.nodes[i].inputs
              if value not in graph.constants and graph.types[value].dtype == "float32"}  # fmt: skip
    members = bf16 | {i for chain in chains.values() for i in chain}
    readers: dict[str, set[int]] = {}
    for i, node in enumerate(graph.nodes):
        for value in node.inputs:
            readers.setdefault(value, set()).add(i)
    outputs = set(graph.outputs)
    return {value: chain for value, chain in chains.items() if chain and all(
        out not in outputs and readers.get(out, set()) <= members for i in chain for out in graph.nodes[i].outputs)}


def _view_chain(graph: Graph, producers: dict[str, int], value: str) -> list[int]:
    """The layout primitives computing `value` from the nearest value that is not a view, `value`'s own producer
    first; empty unless the whole chain is a strided view a matmul can read (ir/strided.py)."""
    chain: list[int] = []
    current = value
    while current in producers and graph.nodes[producers[current]].prim in STRIDED_VIEW_PRIMS:
        chain.append(producers[current])
        current = graph.nodes[producers[current]].inputs[0]
    if not chain or current in graph.constants:  # a constant's view is packed once by the call, converted then
        return []
    view = strided_view(graph, set(chain), value)
    if view is None or len(view.shape) < 2 or 1 not in view.strides[-2:]:
        return []
    return chain


def _fresh(graph: Graph, name: str) -> str:
    candidate, k = name, 0
    while candidate in graph.types:
        k += 1
        candidate = f"{name}{k}"
    return candidate


def _alone(graph: Graph, node: Node, stored_bf16: frozenset[str] = frozenset()) -> CandidateKernel:
    """The node as a kernel of its own, on a graph holding it alone (its operands inputs or constants; those of
    `stored_bf16` given as bfloat16, as their producer would store them)."""
    mini = Graph(inputs=[v for v in dict.fromkeys(node.inputs) if v not in graph.constants],
                 outputs=list(node.outputs), name="precision")  # fmt: skip
    mini.types = {v: graph.types[v] for v in (*node.inputs, *node.outputs)}
    for v in stored_bf16:
        mini.types[v] = TensorType(graph.types[v].shape, "bfloat16")
    mini.constants = {v: graph.constants[v] for v in node.inputs if v in graph.constants}
    mini.nodes = [node]
    return make_kernel(mini, (0,), tuple(node.outputs))


def choose_precision(graph: Graph, cost_model: CostModel | None,
                     precision: str = "fp32") -> tuple[Graph, PrecisionReport]:  # fmt: skip
    """The graph with each linear primitive in its chosen precision, and what was decided. Without a cost model
    (`kernorch check`'s reference run) every candidate is bf16: the mode's largest error."""
    start = time.perf_counter()
    sites = candidates = [i for i, node in enumerate(graph.nodes) if candidate_for_bf16(graph, node)]
    if precision == "fp32" or not sites:
        return graph, PrecisionReport(precision, len(sites), 0, 0.0, 0.0, time.perf_counter() - start)
    if cost_model is None:
        marked = graph.copy()
        for i in sites:
            marked.nodes[i] = with_precision(graph.nodes[i], "bf16")
        converted = with_conversions(marked)
        return converted, PrecisionReport(precision, len(sites), len(sites), math.nan, math.nan,
                                          time.perf_counter() - start, _casts(converted))  # fmt: skip
    chosen = graph.copy()
    count = 0
    for i in sorted(_attention_products(graph, sites)):  # not priced alone: see _attention_products
        chosen.nodes[i] = with_precision(graph.nodes[i], "bf16")
        count += 1
    sites = [i for i in sites if chosen.nodes[i] is graph.nodes[i]]
    producers = {out: i for i, node in enumerate(graph.nodes) for out in node.outputs}
    pairs = {i: (_alone(graph, graph.nodes[i]),
                 _alone(graph, with_precision(graph.nodes[i], "bf16"), _stored_bf16(graph, producers, graph.nodes[i])))
             for i in sites}  # fmt: skip
    cost_model.prepare([k for pair in pairs.values() for k in pair])  # a measuring model times them in one batch
    cost_fp32 = cost_chosen = 0.0
    for i, (fp32, bf16) in pairs.items():
        fp32_cost, bf16_cost = cost_model.cost(fp32), cost_model.cost(bf16)
        if bf16_cost < fp32_cost:
            chosen.nodes[i] = with_precision(graph.nodes[i], "bf16")
            count += 1
        if math.isfinite(fp32_cost):  # a primitive only a fallback runs is priced by neither
            cost_fp32 += fp32_cost
            cost_chosen += min(fp32_cost, bf16_cost)
    converted = with_conversions(chosen)
    return converted, PrecisionReport(precision, len(candidates), count, cost_fp32, cost_chosen,
                                      time.perf_counter() - start, _casts(converted))  # fmt: skip


def _stored_bf16(graph: Graph, producers: dict[str, int], node: Node) -> frozenset[str]:
    """The operands of `node` (bf16) that its plan can read as bfloat16 at no cost of their own: those computed by
    a memory-bound primitive (through a view chain a matmul reads), whose generated kernel stores the cast's
    bfloat16 as it stores float32 (half the bytes). Priced with them float32, the call reorders each on every run
    (a pass over the activation), and convolutions over large activations with few channels stayed float32
    although the plan would have stored their sources bfloat16 (resnet50's first stage, Zen 4). A model input or a
    linear or opaque primitive's output stays float32 here: converting it is the call's (or a kernel's of its
    own)."""
    stored = set()
    for value in node.inputs:
        if value in graph.constants or graph.types[value].dtype != "float32":
            continue
        chain = _view_chain(graph, producers, value) if node.prim == "matmul" else []
        start = graph.nodes[chain[-1]].inputs[0] if chain else value
        producer = producers.get(start)
        if producer is not None and PRIMITIVES[graph.nodes[producer].prim].kind in MEMORY_BOUND_KINDS:
            stored.add(value)
    return frozenset(stored)


def _attention_products(graph: Graph, sites: list[int]) -> set[int]:
    """On a CPU with AMX-BF16: both matmuls of each attention (ir/patterns.py), bf16 without being priced alone.
    The fused attention multiplies them on tiles only when both are bf16 (1.6-1.8x its float32 path), but alone
    each of them, a product of two activations, pays for converting both operands in a oneDNN call and stays
    float32 (vit_tiny's 64-wide heads): so the fused tile kernel was never a candidate. With both bf16 the BLP
    weighs it against the unfused kernels on measured costs, as before."""
    if "amx_bf16" not in isa_flags():
        return set()
    candidates = set(sites)
    return {i for span in attention_spans(graph) if set(span) <= candidates for i in span}


def _casts(graph: Graph) -> int:
    return sum(node.prim == "cast" and node.attr("to") == "bfloat16" for node in graph.nodes)


def kernel_precision(kernel: CandidateKernel) -> str:
    """What a kernel of a bf16 plan multiplies in, and which of the values it reads and writes are bfloat16."""
    graph = kernel.graph
    bf16 = any(node.attr("precision") == "bf16" for node in kernel.primitives)
    line = "bf16 (operands rounded to bfloat16, float32 sums)" if bf16 else "fp32"
    reads = sum(graph.types[v].dtype == "bfloat16" for v in kernel.inputs)
    writes = sum(graph.types[v].dtype == "bfloat16" for v in kernel.outputs)
    converts = sum(node.prim == "cast" and node.attr("to") == "bfloat16" and node.outputs[0] not in kernel.outputs
                   for node in kernel.primitives)  # fmt: skip
    stored = [f"reads {reads} bfloat16 value(s)"] if reads else []
    stored += [f"stores {writes} value(s) as bfloat16"] if writes else []
    stored += [f"converts {converts} float32 operand(s) on every run"] if converts else []
    return line + (f"; {', '.join(stored)}" if stored else "")
