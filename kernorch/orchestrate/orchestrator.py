"""Orchestration driver: partition, enumerate states and candidates, solve the BLP per subgraph, compose."""

from __future__ import annotations

import heapq
import math
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from kernorch.cost.interface import CostModel
from kernorch.ir.graph import Graph
from kernorch.ir.kernel import CandidateKernel
from kernorch.ir.plan import Plan, executable_order, validate_plan
from kernorch.options import OrchestrationLimits
from kernorch.orchestrate.blp import BlpResult, instance_key, next_best, solve_blp
from kernorch.orchestrate.candidates import CandidateSet, Rejection, enumerate_candidates
from kernorch.orchestrate.greedy import greedy_kernels
from kernorch.orchestrate.pruning import LinearEpilogues
from kernorch.orchestrate.states import enumerate_states
from kernorch.orchestrate.subgraph import Subgraph, build_subgraphs, partition, split_range


@dataclass
class SubgraphReport:
    first_node: int
    primitives: int
    states: int
    candidates: int
    node_sets: int
    solve_seconds: float
    status: str
    optimal: bool
    gap: float
    lazy_cuts: int
    cost: float
    greedy_cost: float
    enumerate_seconds: float
    candidates_capped: bool
    rejected_counts: dict[str, int] = field(default_factory=dict)
    same_as: int | None = None  # an earlier subgraph whose BLP instance this is: its solution was reused


@dataclass
class OrchestrationResult:
    plan: Plan
    greedy_plan: Plan
    subgraphs: list[SubgraphReport]
    rejected: list[Rejection]
    limits: OrchestrationLimits
    cost_model: str
    seconds: float
    rewrite_report: Any = None  # kernorch.rewrite.RewriteReport when the graph was rewritten first
    contended_kernels: int = 0  # plan kernels whose measured cost never got a quiet measurement
    layout_report: Any = None  # kernorch.layout.LayoutReport when layouts were chosen
    precision_report: Any = None  # kernorch.precision.PrecisionReport when precisions were chosen
    tuning: dict[str, int] | None = None  # kernels measured here / on Ray workers / foreign results (profiling)
    # the next-best plans by cost, cheapest first (`orchestrate(..., alternatives=k)`), for whole-plan validation
    alternatives: list[Plan] = field(default_factory=list)
    alternative_sources: list[str] = field(default_factory=list)  # what found each alternative, one per plan
    instances: list[Instance] = field(default_factory=list)  # each subgraph's BLP, kept for `add_next_best`
    in_plan: Any = None  # kernorch.validate.in_plan.InPlanReport when costs were measured in place
    validation: Any = None  # kernorch.validate.ValidationReport when the alternatives were timed end to end

    @property
    def all_optimal(self) -> bool:
        return all(s.optimal for s in self.subgraphs)

    def to_json(self) -> dict[str, Any]:
        graph = self.plan.graph
        return {
            "cost_model": self.cost_model,
            "subgraphs": [
                {"primitives": s.primitives, "states": s.states, "candidates": s.candidates,
                 "solve_seconds": round(s.solve_seconds, 4), "status": s.status, "gap": s.gap,
                 "lazy_cuts": s.lazy_cuts, "cost": s.cost, "greedy_cost": s.greedy_cost,
                 "candidates_capped": s.candidates_capped, "same_as": s.same_as}
                for s in self.subgraphs
            ],
            "plan_cost": self.plan.cost,
            "greedy_cost": self.greedy_plan.cost,
            "all_optimal": self.all_optimal,
            "seconds": round(self.seconds, 3),
            "rewrites": self.rewrite_report.to_json() if self.rewrite_report is not None else None,
            "contended_kernels": self.contended_kernels,
            "tuning": self.tuning,
            "layout": self.layout_report.to_json() if self.layout_report is not None else None,
            "precision": self.precision_report.to_json() if self.precision_report is not None else None,
            "validation": self.validation.to_json() if self.validation is not None else None,
            "in_plan": self.in_plan.to_json() if self.in_plan is not None else None,
            "kernels": [
                {"primitives": [graph.nodes[i].prim for i in k.nodes], "nodes": list(k.nodes),
                 "inputs": list(k.inputs), "outputs": list(k.outputs), "cost": cost}
                for k, cost in zip(self.plan.kernels, self.plan.costs, strict=True)
            ],
        }  # fmt: skip


def plan_subgraphs(graph: Graph, limits: OrchestrationLimits) -> list[tuple[Subgraph, int]]:
    """Partition, then split any range whose execution states exceed the cap. Returns (subgraph, states)."""
    pending = partition(graph, limits.max_subgraph_size)
    planned: list[tuple[Subgraph, int]] = []
    while pending:
        start, end = pending.pop(0)
        (sub,) = build_subgraphs(graph, [(start, end)])
        states = enumerate_states(sub, limits.max_states)
        if states.capped and end - start > 1:
            pending[0:0] = split_range(graph, start, end)
            continue
        planned.append((sub, len(states.states)))
    return planned


def orchestrate(
    graph: Graph,
    cost_model: CostModel,
    limits: OrchestrationLimits | None = None,
    progress: Callable[[Iterable[Any]], Iterator[Any]] | None = None,
    alternatives: int = 0,
    keep_instances: bool = False,
) -> OrchestrationResult:
    """The optimal plan of `graph` under `cost_model`, subgraph by subgraph; with `alternatives` > 0 also that
    many next-best whole plans (`add_next_best`). `keep_instances` keeps what `add_next_best` needs, to be asked
    later (the pipeline asks only for the layout it keeps)."""
    limits = limits or OrchestrationLimits()
    started = time.perf_counter()
    epilogues = LinearEpilogues(graph)
    available = set(graph.inputs) | set(graph.constants)
    plan_kernels: list[CandidateKernel] = []
    plan_costs: list[float] = []
    greedy_plan: list[CandidateKernel] = []
    greedy_costs: list[float] = []
    reports: list[SubgraphReport] = []
    rejected: list[Rejection] = []
    subgraphs = plan_subgraphs(graph, limits)
    solved: dict[tuple[object, ...], tuple[int, BlpResult]] = {}  # instance key -> (subgraph, its solution)
    instances: list[Instance] = []  # each subgraph's BLP, for the next-best plans
    keep_instances = keep_instances or alternatives > 0
    enumerated: list[tuple[CandidateSet, list[CandidateKernel], list[CandidateKernel], list[int], float]] = []
    with cost_model.pricing():  # a block in which each candidate is described once
        # every subgraph's candidates are timed in the same rounds, seconds apart (not one subgraph's few)
        with cost_model.measuring_together():
            for sub, _ in (progress(subgraphs) if progress else subgraphs):
                enumerate_started = time.perf_counter()
                enumerated.append((*_enumerated(sub, limits, epilogues, cost_model, rejected),
                                   time.perf_counter() - enumerate_started))  # fmt: skip
        costs_of = [_costs(kernels, cost_model, candidates, rejected)
                    for candidates, kernels, _, _, _ in enumerated]  # fmt: skip
    for (sub, state_count), (candidates, kernels, greedy, greedy_ids, enumerate_seconds), costs in zip(
            subgraphs, enumerated, costs_of, strict=True):  # fmt: skip
        key = instance_key(kernels, costs, sub.required_outputs, available)
        same_as, result = solved.get(key, (None, None))
        if result is None:
            result = solve_blp(kernels, costs, sub.required_outputs, available, limits.solver_time_limit, greedy_ids)
            solved[key] = (len(reports), result)
        else:  # the same instance as an earlier subgraph's: its selection, by position, is optimal here too
            result = replace(result, solve_seconds=0.0)
        greedy_order, stuck = executable_order(greedy, available)
        assert not stuck, "greedy kernels must be executable"
        greedy_plan.extend(greedy[i] for i in greedy_order)
        greedy_costs.extend(costs[greedy_ids[i]] for i in greedy_order)
        plan_kernels.extend(kernels[k] for k in result.chosen)
        plan_costs.extend(costs[k] for k in result.chosen)
        if keep_instances:
            instances.append(Instance(key, kernels, costs, set(sub.required_outputs), set(available), result))
        available |= sub.required_outputs
        reports.append(SubgraphReport(
            first_node=sub.node_ids[0], primitives=sub.size, states=state_count, candidates=len(kernels),
            node_sets=candidates.node_sets, solve_seconds=result.solve_seconds, status=result.status,
            optimal=result.optimal, gap=result.gap, lazy_cuts=result.lazy_cuts, cost=result.cost,
            greedy_cost=sum(costs[i] for i in greedy_ids), enumerate_seconds=enumerate_seconds,
            candidates_capped=candidates.capped, rejected_counts=dict(candidates.rejected_counts), same_as=same_as,
        ))  # fmt: skip
    validate_plan(graph, plan_kernels)
    validate_plan(graph, greedy_plan)
    orchestrated = OrchestrationResult(Plan(graph, plan_kernels, plan_costs), Plan(graph, greedy_plan, greedy_costs),
                                       reports, rejected, limits, cost_model.name, 0.0,
                                       instances=instances)  # fmt: skip
    if alternatives:
        add_next_best(orchestrated, alternatives)
    orchestrated.seconds = time.perf_counter() - started
    return orchestrated


@dataclass
class Instance:
    """One subgraph's BLP as solved: its instance key (twins share it), candidates, costs, the values it must
    write and those present before it."""

    key: tuple[object, ...]
    kernels: list[CandidateKernel]
    costs: list[float]
    required: set[str]
    available: set[str]
    solution: BlpResult


def add_next_best(result: OrchestrationResult, count: int) -> None:
    """Append the `count` cheapest whole plans after the optimum to `result.alternatives` (the result must keep
    its instances: `orchestrate(..., keep_instances=True)`). Each BLP instance gets its `count` next-best
    selections (no-good cuts); subgraphs of one instance (a transformer's layers) take the same rank, so a plan
    is a rank per instance and costs the sum over subgraphs. The cheapest rank vectors after all-zeros are
    enumerated best first (a vector's successors raise one instance's rank by one)."""
    instances, graph = result.instances, result.plan.graph
    assert instances or not result.plan.kernels, "orchestrate(..., keep_instances=True) keeps what this needs"
    first: dict[tuple[object, ...], Instance] = {}
    for instance in instances:
        first.setdefault(instance.key, instance)
    keys = list(first)
    ranked = {key: next_best(instance.kernels, instance.costs, instance.required, instance.available,
                             result.limits.solver_time_limit, [instance.solution], count)
              for key, instance in first.items()}  # fmt: skip
    twins = Counter(instance.key for instance in instances)

    def cost(ranks: tuple[int, ...]) -> float:
        return sum(twins[key] * ranked[key][rank].cost for key, rank in zip(keys, ranks, strict=True))

    start = (0,) * len(keys)
    frontier = [(cost(start), start)]
    seen = {start}
    plans: list[Plan] = []
    while frontier and len(plans) < count:
        _, ranks = heapq.heappop(frontier)
        if ranks != start:
            plans.append(_plan_of(graph, instances, ranked, dict(zip(keys, ranks, strict=True))))
        for i, key in enumerate(keys):
            successor = (*ranks[:i], ranks[i] + 1, *ranks[i + 1:])
            if ranks[i] + 1 < len(ranked[key]) and successor not in seen:
                seen.add(successor)
                heapq.heappush(frontier, (cost(successor), successor))
    result.alternatives = [*result.alternatives, *plans]
    result.alternative_sources = [*result.alternative_sources,
                                  *(f"next best {i}" for i in range(1, len(plans) + 1))]  # fmt: skip


def _plan_of(graph: Graph, instances: list[Instance], ranked: dict[tuple[object, ...], list[BlpResult]],
             ranks: dict[tuple[object, ...], int]) -> Plan:  # fmt: skip
    """The whole plan taking, in each subgraph, its instance's selection of the given rank (twins select by
    position in their own candidate lists, as the optimum does)."""
    kernels: list[CandidateKernel] = []
    costs: list[float] = []
    for instance in instances:
        chosen = ranked[instance.key][ranks[instance.key]].chosen
        kernels.extend(instance.kernels[k] for k in chosen)
        costs.extend(instance.costs[k] for k in chosen)
    validate_plan(graph, kernels)
    return Plan(graph, kernels, costs)


def _enumerated(sub: Subgraph, limits: OrchestrationLimits, epilogues: LinearEpilogues, cost_model: CostModel,
                rejected: list[Rejection]) -> tuple[CandidateSet, list[CandidateKernel], list[CandidateKernel],
                                                    list[int]]:  # fmt: skip
    """The subgraph's candidate kernels (the greedy plan's among them, what the screen lets through), prepared for
    pricing; each candidate left out is added to `rejected`."""
    candidates = enumerate_candidates(sub, limits, epilogues)
    rejected.extend(candidates.rejected)
    kernels = list(candidates.kernels)
    index = {k.key: i for i, k in enumerate(kernels)}
    greedy = greedy_kernels(sub, limits)
    greedy_ids = []
    for kernel in greedy:  # the greedy plan is always a feasible selection of the BLP
        if kernel.key not in index:
            index[kernel.key] = len(kernels)
            kernels.append(kernel)
        greedy_ids.append(index[kernel.key])
    screen = cost_model.screen
    if screen is not None:  # a performance model leaves out what it predicts hopeless, before any measuring
        kernels, greedy_ids = _screened(kernels, greedy_ids, screen, candidates.rejected_counts, rejected)
    cost_model.prepare(kernels)  # a measuring cost model signs them, timed with every subgraph's (the caller's block)
    return candidates, kernels, greedy, greedy_ids


def _costs(kernels: list[CandidateKernel], cost_model: CostModel, candidates: CandidateSet,
           rejected: list[Rejection]) -> list[float]:  # fmt: skip
    """The kernels' costs; each one no backend runs is added to `rejected` with the backend's reason."""
    costs = [cost_model.cost(k) for k in kernels]
    for kernel, cost in zip(kernels, costs, strict=True):
        if cost == math.inf and (reason := cost_model.rejection(kernel)) is not None:  # a backend's reason
            candidates.rejected_counts["backend"] = candidates.rejected_counts.get("backend", 0) + 1
            if candidates.rejected_counts["backend"] <= 200:
                rejected.append(Rejection(kernel.nodes, "backend", reason))
    return costs


def _screened(kernels: list[CandidateKernel], greedy_ids: list[int], screen: Callable[[CandidateKernel], str | None],
              counts: dict[str, int], rejected: list[Rejection]) -> tuple[list[CandidateKernel], list[int]]:
    """The candidates the cost model's screen lets through (never the greedy plan's: it keeps the BLP feasible),
    with the greedy kernels' new positions; each one left out is a rejection with the screen's reason."""
    greedy = set(greedy_ids)
    kept: list[CandidateKernel] = []
    position: dict[int, int] = {}
    for i, kernel in enumerate(kernels):
        reason = None if i in greedy else screen(kernel)
        if reason is None:
            position[i] = len(kept)
            kept.append(kernel)
            continue
        counts["model"] = counts.get("model", 0) + 1
        if counts["model"] <= 200:
            rejected.append(Rejection(kernel.nodes, "model", reason))
    return kept, [position[i] for i in greedy_ids]
