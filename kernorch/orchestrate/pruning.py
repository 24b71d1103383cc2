"""Pruning rules for candidate kernels, as data: each has a name, a reason, and whether it is monotone.

A monotone rule, once violated by a node set, is violated by every superset, so the enumeration stops
growing that set (all rules below are monotone; a non-monotone rule would only reject the set itself).
Kernels are connected by construction: the enumeration grows sets through data edges only.

The rules encode what the backends can generate: a library call (matmul/conv) takes at most a
transposed operand and a bias; opaque primitives run alone; kernels have a maximum size.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

from kernorch.ir.graph import Graph
from kernorch.ir.primitives import PRIMITIVES, Kind
from kernorch.options import OrchestrationLimits
from kernorch.orchestrate.subgraph import Subgraph, iter_bits


class LinearEpilogues:
    """Which primitives each linear primitive may absorb: operand transposes and a bias add."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph

    @cached_property
    def _consumers(self) -> dict[str, list[int]]:
        users: dict[str, list[int]] = {}
        for i, node in enumerate(self.graph.nodes):
            for value in node.inputs:
                users.setdefault(value, []).append(i)
        return users

    @cached_property
    def _producers(self) -> dict[str, int]:
        return {out: i for i, node in enumerate(self.graph.nodes) for out in node.outputs}

    def transposed_operands(self, linear: int) -> set[int]:
        """Transposes swapping the last two axes of a matmul operand: consumed through strides, no copy."""
        node = self.graph.nodes[linear]
        found: set[int] = set()
        if node.prim != "matmul":
            return found
        for value in node.inputs:
            producer = self._producers.get(value)
            if producer is None:
                continue
            candidate = self.graph.nodes[producer]
            rank = self.graph.types[value].rank
            if candidate.prim == "transpose" and rank >= 2 and \
                    tuple(candidate.attr("perm")) == (*range(rank - 2), rank - 1, rank - 2):  # fmt: skip
                found.add(producer)
        return found

    def bias_add(self, linear: int) -> int | None:
        """An `add` of a constant broadcast along the output channel (last axis for matmul, axis 1 for conv)."""
        node = self.graph.nodes[linear]
        out = node.outputs[0]
        out_type = self.graph.types[out]
        for user in self._consumers.get(out, []):
            add = self.graph.nodes[user]
            if add.prim != "add" or self.graph.types[add.outputs[0]] != out_type:
                continue
            other = add.inputs[1] if add.inputs[0] == out else add.inputs[0]
            if other not in self.graph.constants or other == out:
                continue
            shape = self.graph.types[other].shape
            if node.prim == "matmul":
                channel_axis, channels = out_type.rank - 1, out_type.shape[-1]
            else:
                channel_axis, channels = 1, out_type.shape[1]
            offset = out_type.rank - len(shape)
            if all(d == (channels if i + offset == channel_axis else 1) for i, d in enumerate(shape)):
                return user
        return None

    def companions(self, linear: int) -> set[int]:
        bias = self.bias_add(linear)
        return self.transposed_operands(linear) | ({bias} if bias is not None else set())

    def virtual_values(self, linear: int, members: set[int]) -> set[str]:
        """Values that exist only inside the library call when `members` are fused with `linear`."""
        virtual = {self.graph.nodes[t].outputs[0] for t in self.transposed_operands(linear) & members}
        if self.bias_add(linear) in members:
            virtual.add(self.graph.nodes[linear].outputs[0])
        return virtual


@dataclass(frozen=True)
class PruningRule:
    name: str
    monotone: bool
    check: Callable[[Subgraph, int, OrchestrationLimits, LinearEpilogues], str | None]


def _kinds(sub: Subgraph, mask: int) -> list[tuple[int, Kind]]:
    return [(sub.node_ids[i], PRIMITIVES[sub.graph.nodes[sub.node_ids[i]].prim].kind) for i in iter_bits(mask)]


def _max_size(sub: Subgraph, mask: int, limits: OrchestrationLimits, _: LinearEpilogues) -> str | None:
    size = mask.bit_count()
    return f"{size} primitives exceed the max kernel size {limits.max_kernel_size}" \
        if size > limits.max_kernel_size else None  # fmt: skip


def _one_linear(sub: Subgraph, mask: int, limits: OrchestrationLimits, _: LinearEpilogues) -> str | None:
    linear = [n for n, kind in _kinds(sub, mask) if kind == Kind.LINEAR]
    return "two linear primitives: each library call is a kernel of its own" if len(linear) > 1 else None


def _opaque_alone(sub: Subgraph, mask: int, limits: OrchestrationLimits, _: LinearEpilogues) -> str | None:
    kinds = _kinds(sub, mask)
    opaque = [n for n, kind in kinds if kind == Kind.OPAQUE]
    if opaque and len(kinds) > 1:
        return f"opaque primitive {sub.graph.nodes[opaque[0]].prim} runs alone"
    return None


def _linear_epilogue(sub: Subgraph, mask: int, limits: OrchestrationLimits, epilogues: LinearEpilogues) -> str | None:
    kinds = _kinds(sub, mask)
    linear = [n for n, kind in kinds if kind == Kind.LINEAR]
    if not linear:
        return None
    allowed = epilogues.companions(linear[0]) | {linear[0]}
    for node, _kind in kinds:
        if node not in allowed:
            name = sub.graph.nodes[linear[0]].prim
            return (f"{name} fused with {sub.graph.nodes[node].prim}: the library call absorbs only a "
                    "transposed operand and a bias")  # fmt: skip
    return None


PRUNING_RULES: tuple[PruningRule, ...] = (
    PruningRule("max-size", True, _max_size),
    PruningRule("one-linear", True, _one_linear),
    PruningRule("opaque-alone", True, _opaque_alone),
    PruningRule("linear-epilogue", True, _linear_epilogue),
)
