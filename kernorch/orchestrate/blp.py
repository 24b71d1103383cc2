"""The kernel-orchestration BLP (Korch §4.2), solved with HiGHS.

One binary variable per candidate kernel (only those with a finite cost). Constraints:
- output: every value the subgraph must deliver is written by at least one chosen kernel;
- dependency: a chosen kernel's in-subgraph inputs are each written by at least one chosen kernel.

With multi-output kernels these constraints admit selections no order can execute (kernels {a,b} and
{c,d} where each needs the other's first primitive). kernorch adds lazy cuts: after each solve it
simulates the selection; if a set T of chosen kernels is stuck, waiting on values U that no runnable
kernel produced, it adds  Σ_{k∈T} x_k − Σ_{j∈R} x_j ≤ |T| − 1,  R = candidates outside T writing a
value in U, and solves again. The cut is valid: in any executable selection containing all of T, the
first kernel of T to run had its inputs from chosen kernels outside T, one of them writing a value in U.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import highspy
import numpy as np

from kernorch.ir.kernel import CandidateKernel
from kernorch.ir.plan import executable_order


class OrchestrationError(RuntimeError):
    """The solver found no plan (infeasible model or no solution within the time limit)."""


@dataclass
class BlpResult:
    chosen: list[int]  # indices into the candidate list, in an executable order
    cost: float
    status: str  # "optimal", or "time limit (gap x%)"
    optimal: bool
    gap: float
    solve_seconds: float
    lazy_cuts: int
    solves: int


# A value whose producers times consumers exceed this gets its own "is computed" variable (see below): shared
# models solve as fast either way, a branchy graph of 1321 candidates 31 -> 7 s.
AGGREGATE_OVER = 400


def instance_key(candidates: list[CandidateKernel], costs: list[float], required: set[str],
                 available: set[str]) -> tuple[object, ...]:
    """What `solve_blp` sees of an instance, with values renamed by first appearance: two subgraphs with the same
    key are the same BLP (same candidates reading and writing the same positions, same costs, same required and
    available values), so one's optimal selection is the other's. A transformer's layers are such twins."""
    labels: dict[str, int] = {}

    def label(value: str) -> int:
        return labels.setdefault(value, len(labels))

    shapes = tuple((tuple(label(v) for v in k.inputs), tuple(label(v) for v in k.outputs), cost)
                   for k, cost in zip(candidates, costs, strict=True))  # fmt: skip
    wanted = tuple(sorted(label(v) for v in required if v not in available))
    present = tuple(sorted(i for v, i in labels.items() if v in available))
    return shapes, wanted, present


def solve_blp(
    candidates: list[CandidateKernel],
    costs: list[float],
    required: set[str],
    available: set[str],
    time_limit: float,
    warm_start: list[int] | None = None,
    max_rounds: int = 200,
    excluded: Sequence[Sequence[int]] = (),
) -> BlpResult:
    """Pick the cheapest executable set of candidates writing every value in `required`.

    `available` holds values present before the subgraph runs (graph inputs, constants, earlier subgraphs).
    `excluded` holds selections found before (the next-best plans, `next_best`): each gets a no-good cut
    Σ_{k∈S⁺} x_k ≤ |S⁺| − 1 over its kernels of non-zero cost S⁺, so the answer leaves out at least one costly
    kernel of each — another plan, not the same one with a kernel added or a free kernel (a view) dropped.
    """
    variables = [k for k, c in enumerate(costs) if math.isfinite(c)]
    column = {k: i for i, k in enumerate(variables)}
    producers: dict[str, list[int]] = {}
    for k in variables:
        for value in candidates[k].outputs:
            producers.setdefault(value, []).append(k)

    highs = highspy.Highs()
    highs.setOptionValue("output_flag", False)
    highs.setOptionValue("mip_rel_gap", 0.0)
    highs.setOptionValue("mip_abs_gap", 0.0)
    highs.setOptionValue("threads", 1)
    n = len(variables)
    highs.addVars(n, np.zeros(n), np.ones(n))
    # Costs are seconds (~1e-5 per kernel); in those units HiGHS' absolute tolerances swamp the objective.
    # Scale to microseconds.
    highs.changeColsCost(n, np.arange(n, dtype=np.int32), np.array([costs[k] * 1e6 for k in variables]))
    highs.changeColsIntegrality(n, np.arange(n, dtype=np.int32), np.array([highspy.HighsVarType.kInteger] * n))
    infinity = highspy.kHighsInf

    def add_row(lower: float, upper: float, entries: dict[int, float]) -> None:
        indices = np.array(list(entries), dtype=np.int32)
        highs.addRow(lower, upper, len(indices), indices, np.array(list(entries.values()), dtype=np.float64))

    for value in sorted(required):
        if value in available:
            continue
        if value not in producers:
            raise OrchestrationError(f"no candidate kernel writes required value '{value}'")
        add_row(1.0, infinity, {column[j]: 1.0 for j in producers[value]})
    # Every primitive the required values depend on runs in some chosen kernel: a valid inequality (the kernel
    # writing a required value computes its primitives, whose inputs come from inside it or from chosen kernels,
    # and so on up), implied for integer x but not for the LP relaxation. Without it the relaxation covers a
    # required value with six fusion variants at 1/6 each, each needing its inputs at only 1/6: mobileone_s0's
    # branch blocks (221 candidates) relaxed to 13 us against a 201 us optimum and took 28 s to prove.
    for entries in _primitive_covers(candidates, variables, required, available, column):
        add_row(1.0, infinity, entries)
    # A chosen kernel's inputs must be computed: x_k <= sum of x_j over the producers j of each input v. Written
    # directly, every consumer of v repeats v's producer list (227k nonzeros for 927 candidates of a branchy
    # graph, 19 s to solve). Where a value has many producers and many consumers, a continuous y_v in [0, 1]
    # stands for "v is computed" instead: y_v <= sum_j x_j once, and x_k <= y_v per consumer. The LP relaxation
    # is the same (y_v = min(1, sum_j x_j) at best), so is the integer optimum, with far fewer nonzeros.
    consumers: dict[str, list[int]] = {}
    for k in variables:
        for value in dict.fromkeys(candidates[k].inputs):
            if value not in available:
                consumers.setdefault(value, []).append(k)
    aggregated = sorted(v for v, ks in consumers.items() if len(producers.get(v, [])) * len(ks) > AGGREGATE_OVER)
    computed = {v: n + i for i, v in enumerate(aggregated)}
    if aggregated:
        highs.addVars(len(aggregated), np.zeros(len(aggregated)), np.ones(len(aggregated)))
    for value, ks in consumers.items():
        sources = {column[j]: 1.0 for j in producers.get(value, [])}
        if value in computed:
            add_row(0.0, infinity, {**sources, computed[value]: -1.0})
        for k in ks:
            entries = {computed[value]: 1.0} if value in computed else dict(sources)
            entries[column[k]] = entries.get(column[k], 0.0) - 1.0
            add_row(0.0, infinity, entries)

    for selection in excluded:
        costly = [k for k in selection if costs[k] > 0]
        if all(k in column for k in costly):  # (one with an infinite-cost kernel cannot be chosen anyway)
            add_row(-infinity, len(costly) - 1.0, {column[k]: 1.0 for k in costly})
    # The warm start (the greedy plan) when it is executable: HiGHS starts from it after every round of cuts (it
    # satisfies them all), and it is the answer when the time runs out before a better incumbent is found.
    fallback: list[int] | None = None
    if any({k for k in selection if costs[k] > 0} <= set(warm_start or ()) for selection in excluded):
        warm_start = None  # the greedy plan is excluded: no warm start, no fallback
    if warm_start and all(k in column for k in warm_start):
        order, stuck = executable_order([candidates[k] for k in warm_start], available)
        fallback = None if stuck else [warm_start[i] for i in order]
    start_values = np.zeros(n + len(aggregated))
    for k in fallback or []:
        start_values[column[k]] = 1.0
        for value in candidates[k].outputs:
            if value in computed:
                start_values[computed[value]] = 1.0

    def warm() -> None:
        if fallback is not None:
            solution = highspy.HighsSolution()
            solution.col_value = list(start_values)
            highs.setSolution(solution)

    def out_of_time(status: str, bound: float) -> BlpResult:
        """The greedy plan, with the gap to the solver's lower bound (µs) where it has one."""
        assert fallback is not None
        cost = sum(costs[k] for k in fallback)
        gap = (cost * 1e6 - bound) / (cost * 1e6) if math.isfinite(bound) and cost > 0 else math.inf
        return BlpResult(fallback, cost, f"{status}: the greedy plan, no better incumbent in time (gap "
                         f"{'unknown' if math.isinf(gap) else f'{max(gap, 0.0):.2%}'})", False, max(gap, 0.0),
                         time.perf_counter() - started, cuts, solves)  # fmt: skip

    started = time.perf_counter()
    cuts = 0
    solves = 0
    for solves in range(1, max_rounds + 1):
        remaining = time_limit - (time.perf_counter() - started)
        if remaining <= 0 and fallback is not None:
            return out_of_time("time limit reached", -math.inf)
        warm()
        highs.setOptionValue("time_limit", max(remaining, 0.1))
        highs.run()
        model_status = highs.getModelStatus()
        info = highs.getInfo()
        if model_status == highspy.HighsModelStatus.kInfeasible:
            raise OrchestrationError("the kernel-orchestration BLP is infeasible")
        if info.primal_solution_status != 2:  # 2 = feasible solution available
            if fallback is not None:
                return out_of_time(highs.modelStatusToString(model_status).lower(), float(info.mip_dual_bound))
            raise OrchestrationError(f"no plan found: solver status {highs.modelStatusToString(model_status)}")
        solution_values = highs.getSolution().col_value
        chosen = [variables[i] for i in range(n) if solution_values[i] > 0.5]
        order, stuck = executable_order([candidates[k] for k in chosen], available)
        if not stuck:
            optimal = model_status == highspy.HighsModelStatus.kOptimal
            gap = 0.0 if optimal else float(info.mip_gap)
            status = "optimal" if optimal else f"{highs.modelStatusToString(model_status).lower()} (gap {gap:.2%})"
            return BlpResult([chosen[i] for i in order], sum(costs[k] for k in chosen), status, optimal, gap,
                             time.perf_counter() - started, cuts, solves)  # fmt: skip
        stuck_kernels = [chosen[i] for i in stuck]
        produced = set(available)
        for i in order:
            produced.update(candidates[chosen[i]].outputs)
        waiting = {v for k in stuck_kernels for v in candidates[k].inputs if v not in produced}
        enablers = {j for v in waiting for j in producers.get(v, [])} - set(stuck_kernels)
        entries = {column[k]: 1.0 for k in stuck_kernels}
        entries.update({column[j]: -1.0 for j in enablers})
        add_row(-infinity, len(stuck_kernels) - 1.0, entries)
        cuts += 1
    if fallback is not None:
        return out_of_time(f"{max_rounds} rounds of lazy cuts", -math.inf)
    raise OrchestrationError(f"no executable plan after {max_rounds} rounds of lazy cuts")


def _primitive_covers(candidates: list[CandidateKernel], variables: list[int], required: set[str],
                      available: set[str], column: dict[int, int]) -> list[dict[int, float]]:
    """One row per primitive a required value depends on within the subgraph: the columns of the kernels that
    compute it (each a coefficient 1; the row asks for at least one)."""
    computing: dict[tuple[str, ...], list[int]] = {}
    producer: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {}  # value -> (its primitive's outputs, inputs)
    for k in variables:
        for node in candidates[k].primitives:
            computing.setdefault(tuple(node.outputs), []).append(column[k])
            for value in node.outputs:
                producer[value] = (tuple(node.outputs), tuple(node.inputs))
    needed: set[tuple[str, ...]] = set()
    pending = [v for v in required if v not in available]
    while pending:
        value = pending.pop()
        if value in available or value not in producer or producer[value][0] in needed:
            continue
        outputs, inputs = producer[value]
        needed.add(outputs)
        pending += inputs
    return [dict.fromkeys(computing[outputs], 1.0) for outputs in sorted(needed)]


def next_best(candidates: list[CandidateKernel], costs: list[float], required: set[str], available: set[str],
              time_limit: float, ranked: list[BlpResult], count: int) -> list[BlpResult]:
    """`ranked` (the optimum first) extended by up to `count` next-best selections, each solved optimally with
    no-good cuts on the costly kernels of every selection before it; fewer when no other plan exists or a solve
    runs out of time (its incumbent is then not provably the next best and is left out)."""
    ranked = list(ranked)
    for _ in range(count):
        if not any(costs[k] > 0 for k in ranked[-1].chosen):  # nothing costly to leave out: no other plan
            break
        try:
            result = solve_blp(candidates, costs, required, available, time_limit,
                               excluded=[r.chosen for r in ranked])  # fmt: skip
        except OrchestrationError:  # infeasible: the selections so far are all there are
            break
        if not result.optimal:
            break
        ranked.append(result)
    return ranked
