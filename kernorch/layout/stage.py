"""The layout stage: which values are stored channels-last (or in any other axis order), for the whole graph.

Between rewrite and orchestrate. Convolutions run much faster on channels-last activations on this CPU,
but every change of layout between two primitives costs a transpose. Instead of choosing conv by conv,
`choose_layouts` decides for every value at once with an exact 0-1 program (assign.py) over measured conv
costs in both layouts and measured transpose costs, then rewrites the graph (materialize.py): afterwards a
channels-last conv is just a conv primitive with `channels_last`, transposes that cancel are gone, and the
ones that remain are ordinary layout primitives the orchestrator fuses into neighbouring kernels.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kernorch.cost.interface import CostModel
from kernorch.ir.graph import Graph, Node
from kernorch.ir.kernel import CandidateKernel, make_kernel
from kernorch.ir.primitives import PRIMITIVES
from kernorch.layout.assign import POLICIES, Assignment, assign_layouts
from kernorch.layout.layouts import Perm, between, canonical, channels_last, permute
from kernorch.layout.materialize import materialize
from kernorch.layout.modes import CONV_PRIMS

__all__ = ["POLICIES", "LayoutReport", "choose_layouts"]


@dataclass(frozen=True)
class LayoutReport:
    policy: str
    convs: int
    channels_last_convs: int
    transposes: int  # layout changes the assignment inserts
    cost: float  # objective of the chosen layouts (conv modes + transposes), seconds
    nchw_cost: float  # the same objective with every value row-major
    seconds: float
    status: str
    note: str = ""  # with policy auto: which assignment the orchestrated plans chose, and their costs
    # value -> the axis order it is stored in (materialize.py: transpose(v, layout) under v's name); what reads a
    # plan's intermediate values (the rounding arbiter) turns them back. Not in to_json: a model's worth of names
    layouts: dict[str, Perm] = field(default_factory=dict, compare=False, repr=False)

    def summary(self) -> str:
        text = (f"layout ({self.policy}): {self.channels_last_convs} of {self.convs} convolutions channels-last, "
                f"{self.transposes} layout change(s); modelled cost {self.cost * 1e3:.3f} ms vs "
                f"{self.nchw_cost * 1e3:.3f} ms all-NCHW ({self.seconds:.1f} s)")  # fmt: skip
        return f"{text}; chosen: {self.note}" if self.note else text

    def to_json(self) -> dict[str, Any]:
        return {name: value for name, value in vars(self).items() if name != "layouts"}


def _conv_kernel(graph: Graph, node: Node, last: bool) -> CandidateKernel:
    """The conv alone, on a graph of its own, in the layout asked for (conv_integer's zero points with it)."""
    x, *operands = node.inputs
    x_type, out_type = graph.types[x], graph.types[node.outputs[0]]
    mini = Graph(inputs=[x], outputs=[node.outputs[0]], name="layout-conv")
    if last:
        rank = x_type.rank
        x_type = type(x_type)(permute(x_type.shape, channels_last(rank)), x_type.dtype)
        out_type = type(out_type)(permute(out_type.shape, channels_last(rank)), out_type.dtype)
    mini.types = {x: x_type, node.outputs[0]: out_type, **{v: graph.types[v] for v in operands}}
    for value in dict.fromkeys(operands):
        if value in graph.constants:
            mini.constants[value] = graph.constants[value]
        else:
            mini.inputs.append(value)
    attrs = {**node.attr_dict, "channels_last": True} if last else node.attr_dict
    mini.nodes = [Node(node.prim, node.inputs, node.outputs, tuple(sorted(attrs.items())), node.origin)]
    return make_kernel(mini, (0,), (node.outputs[0],))


def _transpose_kernel(graph: Graph, value: str, source: Perm, target: Perm) -> CandidateKernel:
    value_type = graph.types[value]
    stored = type(value_type)(permute(value_type.shape, source), value_type.dtype)
    perm = between(source, target)
    mini = Graph(inputs=["x"], outputs=["y"], name="layout-transpose")
    mini.types = {"x": stored, "y": PRIMITIVES["transpose"].infer([stored], {"perm": perm})[0]}
    mini.nodes = [Node("transpose", ("x",), ("y",), (("perm", perm),), "layout")]
    return make_kernel(mini, (0,), ("y",))


def choose_layouts(graph: Graph, cost_model: CostModel, policy: str = "auto") -> tuple[Graph, LayoutReport]:
    """The graph with every value in its chosen layout, and what was decided."""
    kernels: dict[tuple[Any, ...], CandidateKernel] = {}

    def conv_kernel(node: Node, last: bool) -> CandidateKernel:
        key = ("conv", node.outputs[0], last)
        if key not in kernels:
            kernels[key] = _conv_kernel(graph, node, last)
        return kernels[key]

    def transpose_kernel(value: str, source: Perm, target: Perm) -> CandidateKernel:
        t = graph.types[value]
        key = ("transpose", permute(t.shape, source), between(source, target), t.dtype)
        if key not in kernels:
            kernels[key] = _transpose_kernel(graph, value, source, target)
        return kernels[key]

    # First pass only collects the kernels to cost, so a measuring cost model can time them in one batch.
    run_assignment: Callable[..., Assignment] = assign_layouts
    if policy != "nchw" and any(n.prim in CONV_PRIMS for n in graph.nodes):
        run_assignment(graph, lambda n, last: (conv_kernel(n, last), 0.0)[1],
                       lambda v, s, t: (transpose_kernel(v, s, t), 0.0)[1], policy)  # fmt: skip
        cost_model.prepare(list(kernels.values()))
    assignment = run_assignment(graph, lambda n, last: cost_model.cost(conv_kernel(n, last)),
                                lambda v, s, t: cost_model.cost(transpose_kernel(v, s, t)), policy)  # fmt: skip
    convs = [i for i, n in enumerate(graph.nodes) if n.prim in CONV_PRIMS]
    report = LayoutReport(policy, len(convs), sum(assignment.modes[i].reads_channels_last for i in convs),
                          assignment.transposes, assignment.cost, assignment.nchw_cost, assignment.seconds,
                          assignment.status, layouts=dict(assignment.layouts))  # fmt: skip
    # everything row-major: nothing to rewrite, unless an int8 convolution runs channels-last on the same bytes (a
    # convolution to one channel reading its input through a transpose): it needs its `channels_last` attribute,
    # without which it runs in the reference implementation (oneDNN 3.2 has no other for NCHW int8)
    if not any(layout != canonical(tuple(range(len(layout))), graph.types[v].shape)
               for v, layout in assignment.layouts.items()) \
            and not any(mode.channels_last and graph.nodes[i].prim == "conv_integer"
                        for i, mode in assignment.modes.items()):  # fmt: skip
        return graph, report
    return materialize(graph, assignment), report
