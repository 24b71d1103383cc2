"""Subgraphs of the primitive graph as bitmask DAGs, and automatic partitioning of large graphs.

A subgraph is a contiguous range of the graph's topological order; such a range is always convex,
so plans of consecutive subgraphs compose into a valid plan. Cuts go where few values are live
across them (the "narrow frontier"), and a range whose execution states exceed the cap is split again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

from kernorch.ir.graph import Graph, Node
from kernorch.ir.patterns import attention_spans
from kernorch.ir.primitives import PRIMITIVES, STRIDED_VIEW_PRIMS, Kind


@dataclass
class Subgraph:
    graph: Graph
    node_ids: list[int]  # graph node indices, topological
    required_outputs: set[str] = field(default_factory=set)  # needed by later subgraphs or graph outputs

    @property
    def size(self) -> int:
        return len(self.node_ids)

    @cached_property
    def local(self) -> dict[int, int]:
        return {node: i for i, node in enumerate(self.node_ids)}

    @cached_property
    def producer(self) -> dict[str, int]:
        """Value name -> local index of the node producing it (only values produced in this subgraph)."""
        return {out: i for i, node in enumerate(self.node_ids) for out in self.graph.nodes[node].outputs}

    @cached_property
    def pred_masks(self) -> list[int]:
        masks = []
        for node in self.node_ids:
            mask = 0
            for value in self.graph.nodes[node].inputs:
                if value in self.producer:
                    mask |= 1 << self.producer[value]
            masks.append(mask)
        return masks

    @cached_property
    def succ_masks(self) -> list[int]:
        masks = [0] * self.size
        for i, preds in enumerate(self.pred_masks):
            for j in iter_bits(preds):
                masks[j] |= 1 << i
        return masks

    @cached_property
    def ancestor_masks(self) -> list[int]:
        masks = [0] * self.size
        for i in range(self.size):  # topological: predecessors' ancestors are final
            mask = self.pred_masks[i]
            for j in iter_bits(self.pred_masks[i]):
                mask |= masks[j]
            masks[i] = mask
        return masks

    @cached_property
    def descendant_masks(self) -> list[int]:
        masks = [0] * self.size
        for i in reversed(range(self.size)):
            mask = self.succ_masks[i]
            for j in iter_bits(self.succ_masks[i]):
                mask |= masks[j]
            masks[i] = mask
        return masks

    @cached_property
    def unit_masks(self) -> list[int]:
        """unit_masks[i]: the nodes enumerated together with node i — its scalar region (`scalar_regions`), or
        the node alone. Candidate kernels are unions of units."""
        units = [1 << i for i in range(self.size)]
        for region in scalar_regions(self):
            for i in iter_bits(region):
                units[i] = region
        return units

    @cached_property
    def unit_leaders(self) -> int:
        """One node of each unit (its first): a node set's size in units is (mask & unit_leaders).bit_count()."""
        return sum(1 << i for i in range(self.size) if (self.unit_masks[i] & -self.unit_masks[i]) == 1 << i)


# Values of one element in dtypes a generated kernel computes in (bfloat16 is moved only: never grouped)
SCALAR_DTYPES = frozenset({"float32", "float64", "int64", "int32", "int16", "uint16", "int8", "uint8", "bool"})
# A larger region stays nodes of its own: one kernel holding it whole might inline too large an expression
MAX_SCALAR_REGION = 32


def _is_scalar(graph: Graph, node: Node) -> bool:
    if PRIMITIVES[node.prim].kind not in (Kind.ELEMENTWISE, Kind.LAYOUT):
        return False
    return all(graph.types[v].dtype in SCALAR_DTYPES and all(d == 1 for d in graph.types[v].shape)
               for v in (*node.inputs, *node.outputs))  # fmt: skip


def scalar_regions(sub: Subgraph) -> list[int]:
    """Connected sets (of two or more) of scalar primitives — elementwise or layout, every operand and result one
    element — that are convex: each is enumerated as one unit. A dynamic quantizer's scale and zero point are
    such a chain (min, max, range, its zero guard, the divisions, the rounding, casts and the scale products:
    eighteen primitives in a squeezenet layer), and every connected subset of it fused with its neighbours was a
    candidate of its own (10 624 in a 32-primitive subgraph, each described and priced). Splitting a region over
    kernels saves no traffic — its values are single elements — so the plans left out differ from the kept ones
    by where a few scalars are computed. A region that is not convex (a scalar feeding a map whose reduction
    feeds the region again) stays nodes of its own."""
    scalar = 0
    for i, node in enumerate(sub.node_ids):
        if _is_scalar(sub.graph, sub.graph.nodes[node]):
            scalar |= 1 << i
    regions, left = [], scalar
    while left:
        region = frontier = left & -left
        while frontier:
            reach = 0
            for i in iter_bits(frontier):
                reach |= sub.pred_masks[i] | sub.succ_masks[i]
            frontier = reach & scalar & ~region
            region |= frontier
        left &= ~region
        if 1 < region.bit_count() <= MAX_SCALAR_REGION and is_convex(sub, region):
            regions.append(region)
    return regions


def iter_bits(mask: int) -> list[int]:
    bits = []
    while mask:
        low = mask & -mask
        bits.append(low.bit_length() - 1)
        mask ^= low
    return bits


def is_convex(sub: Subgraph, mask: int) -> bool:
    ancestors = descendants = 0
    for i in iter_bits(mask):
        ancestors |= sub.ancestor_masks[i]
        descendants |= sub.descendant_masks[i]
    return (ancestors & descendants & ~mask) == 0


def values_spanning(graph: Graph, counted: Callable[[Node, Node], bool]) -> list[int]:
    """counts[i]: values produced before position i with a consumer at or after it that `counted(producer,
    consumer)` accepts."""
    position = {out: i for i, node in enumerate(graph.nodes) for out in node.outputs}
    last_use: dict[str, int] = {}
    for i, node in enumerate(graph.nodes):
        for value in node.inputs:
            if value in position and counted(graph.nodes[position[value]], node):
                last_use[value] = i
    delta = [0] * (len(graph.nodes) + 1)
    for value, last in last_use.items():
        delta[position[value] + 1] += 1
        delta[last + 1] -= 1
    counts, running = [], 0
    for i in range(len(graph.nodes) + 1):
        running += delta[i]
        counts.append(running)
    return counts


def cut_widths(graph: Graph) -> list[int]:
    """widths[i]: number of values produced before position i and consumed at or after it."""
    return values_spanning(graph, lambda producer, consumer: True)


# What a cut inside an attention costs on top of its width: the fused-attention candidate needs the whole
# attention in one subgraph (vit_tiny's partition cut 1 of its 12), and its scores are the widest value inside it
ATTENTION_CUT = 8.0


def _attention_end(graph: Graph, second: int) -> int:
    """The attention's last position: the division of ·V's product by the row sum where the softmax divides
    after the product (the candidate holds it: a cut before it left pit_ti's 730-token attention unfused),
    else the second matmul."""
    (product,) = graph.nodes[second].outputs
    divisions = [i for i, node in enumerate(graph.nodes) if node.prim == "div" and node.inputs[0] == product]
    return divisions[0] if len(divisions) == 1 else second


# What a cut costs per value crossing it that a kernel could have kept inside, on top of the width: a cut before a
# convolution's operand loses nothing (the library call reads it from memory anyway), one inside an elementwise
# chain separates primitives one kernel could hold (a static-QDQ candy's quantizer chains were cut between the
# rounding and its cast to int8, each half a kernel of its own writing the map once more). Four: one more
# subgraph (a cut of one value, 1 + 1) costs less than one such cut inside a chain
FUSED_CUT = 4.0


def fusable(producer: Node, consumer: Node) -> bool:
    """Whether one kernel could hold both: not an opaque primitive; a library call with what it absorbs (operand
    views and bfloat16 conversions before it, elementwise epilogues after it); anything else with anything."""
    kinds = PRIMITIVES[producer.prim].kind, PRIMITIVES[consumer.prim].kind
    if Kind.OPAQUE in kinds:
        return False
    if kinds[1] == Kind.LINEAR:
        return producer.prim in STRIDED_VIEW_PRIMS or producer.prim == "cast" and producer.attr("to") == "bfloat16"
    return kinds[0] != Kind.LINEAR or kinds[1] == Kind.ELEMENTWISE


def cut_costs(graph: Graph) -> list[float]:
    """What cutting before each position costs: its width, FUSED_CUT per value it keeps from a kernel that could
    hold its producer and a consumer, and ATTENTION_CUT inside each attention span."""
    costs = [w + FUSED_CUT * f for w, f in zip(cut_widths(graph), values_spanning(graph, fusable), strict=True)]
    for first, second in attention_spans(graph):
        for position in range(first + 1, _attention_end(graph, second) + 1):
            costs[position] += ATTENTION_CUT
    return costs


def partition(graph: Graph, max_size: int) -> list[tuple[int, int]]:
    """Split positions [0, n) into ranges of at most `max_size` nodes, minimizing the summed cut cost (`cut_costs`;
    dynamic programming; every cut also pays 1 so fewer, larger subgraphs win ties)."""
    n = len(graph.nodes)
    if n == 0:
        return []
    widths = cut_costs(graph)
    best = [0.0] + [float("inf")] * n
    previous = [0] * (n + 1)
    for end in range(1, n + 1):
        for start in range(max(0, end - max_size), end):
            penalty = 0.0 if start == 0 else widths[start] + 1.0
            if best[start] + penalty < best[end]:
                best[end] = best[start] + penalty
                previous[end] = start
    ranges = []
    end = n
    while end > 0:
        ranges.append((previous[end], end))
        end = previous[end]
    return ranges[::-1]


def build_subgraphs(graph: Graph, ranges: list[tuple[int, int]]) -> list[Subgraph]:
    consumer_positions: dict[str, list[int]] = {}
    for i, node in enumerate(graph.nodes):
        for value in node.inputs:
            consumer_positions.setdefault(value, []).append(i)
    outputs = set(graph.outputs)
    subgraphs = []
    for start, end in ranges:
        required = set()
        for i in range(start, end):
            for value in graph.nodes[i].outputs:
                if value in outputs or any(p >= end for p in consumer_positions.get(value, [])):
                    required.add(value)
        subgraphs.append(Subgraph(graph, list(range(start, end)), required))
    return subgraphs


def split_range(graph: Graph, start: int, end: int) -> list[tuple[int, int]]:
    """Cut one range in two at its cheapest inner position (`cut_costs`; nearest the middle on ties)."""
    widths = cut_costs(graph)
    middle = (start + end) / 2
    cut = min(range(start + 1, end), key=lambda i: (widths[i], abs(i - middle)))
    return [(start, cut), (cut, end)]
