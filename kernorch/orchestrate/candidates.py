"""Candidate kernels (Korch §4.1): connected convex node sets of a subgraph, each with its output sets.

Convex sets are exactly the differences of two execution states (Korch Theorem 1). kernorch grows
them directly: every connected convex set can be built from a single node by adding one neighbour at a
time while staying connected and convex (remove a source or sink that is not a cut vertex, repeatedly),
so growing from singletons and discarding non-convex sets finds them all. Monotone pruning rules stop
the growth early. Each node set is kept once (its bitmask is the canonical key). The singletons are units:
a node, or a convex region of one-element values grown and counted as one (subgraph.scalar_regions) — the
same argument on the DAG with each region contracted to a node.

Output sets (Definition 3): values some other kernel or the subgraph's consumers need. Values not
consumed inside the kernel are mandatory outputs; values also consumed inside are optional, so one
node set yields several candidates (multi-output kernels).

Recomputed inputs (beyond Korch's convex sets): a kernel may also recompute an elementwise primitive
feeding it whose value another branch needs on the way to this kernel, never writing that value. An
instance norm's normalization reads d = x − mean, which its variance also squares: the set {d, normalize}
is not convex (d → variance → normalize), so without this every plan either writes d or reads the map three
times in one kernel; with it, the statistics read the map without writing d and the normalization computes
d itself (candy: 57.9 -> 46.8 µs per norm, measured). Executable as long as another kernel provides the
branch; the BLP's lazy cuts refuse a selection where none does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import combinations

from kernorch.ir.kernel import CandidateKernel, make_kernel
from kernorch.ir.primitives import PRIMITIVES, Kind
from kernorch.options import OrchestrationLimits
from kernorch.orchestrate.attention_sets import attention_sets
from kernorch.orchestrate.pruning import PRUNING_RULES, LinearEpilogues, node_kinds
from kernorch.orchestrate.subgraph import Subgraph, is_convex, iter_bits


@dataclass
class Rejection:
    nodes: tuple[int, ...]
    rule: str
    reason: str


@dataclass
class CandidateSet:
    kernels: list[CandidateKernel]
    node_sets: int  # distinct convex node sets accepted
    rejected: list[Rejection] = field(default_factory=list)
    rejected_counts: dict[str, int] = field(default_factory=dict)
    capped: bool = False


def _reject(result: CandidateSet, sub: Subgraph, mask: int, rule: str, reason: str, keep: int = 200) -> None:
    result.rejected_counts[rule] = result.rejected_counts.get(rule, 0) + 1
    if result.rejected_counts[rule] <= keep:
        result.rejected.append(Rejection(tuple(sub.node_ids[i] for i in iter_bits(mask)), rule, reason))


def output_sets(sub: Subgraph, mask: int, epilogues: LinearEpilogues,
                limits: OrchestrationLimits) -> tuple[list[tuple[str, ...]], str | None]:  # fmt: skip
    """The output sets of a node set, or a reason why it can have none."""
    graph = sub.graph
    members = [sub.node_ids[i] for i in iter_bits(mask)]
    consumed_inside: set[str] = set()
    for node in members:
        consumed_inside.update(graph.nodes[node].inputs)
    outside_mask = ((1 << sub.size) - 1) & ~mask
    consumed_outside: set[str] = set()
    for i in iter_bits(outside_mask):
        consumed_outside.update(graph.nodes[sub.node_ids[i]].inputs)
    linear = [n for n in members if PRIMITIVES[graph.nodes[n].prim].kind == Kind.LINEAR]
    # a library call reads its operand views through strides: their values are never written, so another
    # kernel (which may repeat the same views) provides them where they are needed outside
    read_through = epilogues.operand_views(linear[0]) if linear else set()
    produced = [v for node in members if node not in read_through for v in graph.nodes[node].outputs]
    boundary = [v for v in produced if v in sub.required_outputs or v in consumed_outside]
    mandatory = [v for v in boundary if v not in consumed_inside]
    optional = [v for v in boundary if v in consumed_inside]
    if linear and (len(mandatory) > 1 or optional):
        # a library call writes only its final value: everything else exists only inside the call
        trapped = (optional or mandatory[:-1])[0]
        return [], f"{trapped} is needed outside but exists only inside the library call"
    if not mandatory:
        return [], "computes nothing that is needed outside it"
    if len(optional) <= limits.max_optional_outputs:
        extra = [c for r in range(len(optional) + 1) for c in combinations(optional, r)]
    else:
        extra = [(), tuple(optional)]
    return [tuple(mandatory) + tuple(e) for e in extra], None


def enumerate_candidates(sub: Subgraph, limits: OrchestrationLimits, epilogues: LinearEpilogues) -> CandidateSet:
    result = CandidateSet([], 0)
    monotone = [r for r in PRUNING_RULES if r.monotone]
    final = [r for r in PRUNING_RULES if not r.monotone]
    neighbours = [sub.pred_masks[i] | sub.succ_masks[i] for i in range(sub.size)]
    seen: set[int] = set()
    accepted: list[int] = []
    frontier = list(dict.fromkeys(sub.unit_masks))  # each node alone, or its scalar region whole
    seen.update(frontier)
    while frontier:
        grown: list[int] = []
        for mask in frontier:
            violated = next(((r.name, reason) for r in monotone
                             if (reason := r.check(sub, mask, limits, epilogues)) is not None), None)  # fmt: skip
            if violated:
                _reject(result, sub, mask, *violated)
                continue
            rejected = next(((r.name, reason) for r in final
                             if (reason := r.check(sub, mask, limits, epilogues)) is not None), None)  # fmt: skip
            if rejected:
                _reject(result, sub, mask, *rejected)
            else:
                sets, why_not = output_sets(sub, mask, epilogues, limits)
                if why_not:
                    _reject(result, sub, mask, "outputs", why_not)
                else:
                    result.node_sets += 1
                    nodes = tuple(sub.node_ids[i] for i in iter_bits(mask))
                    result.kernels.extend(make_kernel(sub.graph, nodes, outs) for outs in sets)
                    if result.node_sets >= limits.max_candidates:
                        result.capped = True
                        return result
                    accepted.append(mask)
            reach = 0
            for i in iter_bits(mask):
                reach |= neighbours[i]
            reach &= ~mask
            for i in iter_bits(reach):
                extended = mask | sub.unit_masks[i]
                if extended not in seen:
                    seen.add(extended)
                    if is_convex(sub, extended):
                        grown.append(extended)
        frontier = grown
    emitted = set(accepted)
    for mask in accepted:
        for extended, recomputed in _recomputing(sub, mask, emitted):
            emitted.add(extended)
            if any(r.check(sub, extended, limits, epilogues) is not None for r in PRUNING_RULES):
                continue
            sets, why_not = output_sets(sub, extended, epilogues, limits)
            written = set(sub.graph.nodes[sub.node_ids[recomputed]].outputs)
            sets = list(dict.fromkeys(tuple(v for v in outs if v not in written) for outs in sets))
            if why_not or not sets or not all(sets):
                continue
            nodes = tuple(sub.node_ids[i] for i in iter_bits(extended))
            result.node_sets += 1
            result.kernels.extend(make_kernel(sub.graph, nodes, outs) for outs in sets)
    for mask, core in attention_sets(sub):  # two linear primitives: found by pattern, not grown (attention_sets.py)
        outputs, why_not = _attention_outputs(sub, mask, core)
        if why_not:
            _reject(result, sub, mask, "attention-outputs", why_not)
            continue
        result.node_sets += 1
        result.kernels.append(make_kernel(sub.graph, tuple(sub.node_ids[i] for i in iter_bits(mask)), outputs))
    return result


def _attention_outputs(sub: Subgraph, mask: int, core: int) -> tuple[tuple[str, ...], str | None]:
    """An attention set's one output: its result. The nodes computing its operands are read through, like a
    library call's operand views; a value of the core needed outside it other than the result refuses it."""
    graph = sub.graph
    outside = ((1 << sub.size) - 1) & ~mask
    consumed_outside = {v for i in iter_bits(outside) for v in graph.nodes[sub.node_ids[i]].inputs}
    needed = [v for i in iter_bits(core) for v in graph.nodes[sub.node_ids[i]].outputs
              if v in sub.required_outputs or v in consumed_outside]  # fmt: skip
    consumed_inside = {v for i in iter_bits(mask) for v in graph.nodes[sub.node_ids[i]].inputs}
    if len(needed) != 1 or needed[0] in consumed_inside:
        return (), f"{', '.join(needed) or 'nothing'} needed outside the attention"
    return (needed[0],), None


def _recomputing(sub: Subgraph, mask: int, emitted: set[int]) -> list[tuple[int, int]]:
    """(mask plus p, p) for each elementwise primitive p feeding the node set `mask` whose value also feeds a
    path back into it: the non-convex sets where the kernel computes p itself (see the module docstring)."""
    if any(kind in (Kind.LINEAR, Kind.OPAQUE) for _, kind in node_kinds(sub, mask)):
        return []
    feeding = 0
    for i in iter_bits(mask):
        feeding |= sub.pred_masks[i]
    found = []
    for p in iter_bits(feeding & ~mask):
        node = sub.graph.nodes[sub.node_ids[p]]
        if PRIMITIVES[node.prim].kind != Kind.ELEMENTWISE or len(node.outputs) != 1 or sub.unit_masks[p] != 1 << p:
            continue
        extended = mask | (1 << p)
        # p's inputs come from outside (p is not downstream of the set), and the set is not convex with it:
        # p's value reaches the set through a primitive outside it as well
        if extended in emitted or sub.ancestor_masks[p] & mask or is_convex(sub, extended):
            continue
        # and only that way: every other use of p's value leads back into the set, so with p recomputed here
        # the value need never be written (a value needed elsewhere anyway is read more cheaply than its inputs)
        others = sub.succ_masks[p] & ~mask
        if set(node.outputs) & sub.required_outputs or any(not sub.descendant_masks[c] & mask
                                                           for c in iter_bits(others)):  # fmt: skip
            continue
        found.append((extended, p))
    return found
