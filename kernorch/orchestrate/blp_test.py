"""The BLP optimum equals a brute-force optimum on random small DAGs with random kernel costs.

The oracle is independent of the BLP: Dijkstra over sets of available values, where running a kernel
whose inputs are available adds its outputs at its cost. The cheapest path to a set holding every
required value is the cheapest selection that some order can execute.
"""

from __future__ import annotations

import heapq
import math
import random

import highspy
import numpy as np
import pytest

from kernorch.devtools.mutate import here
from kernorch.ir.graph import Graph, Node
from kernorch.ir.kernel import CandidateKernel, make_kernel
from kernorch.ir.plan import PlanError, executable_order, validate_plan
from kernorch.ir.types import TensorType
from kernorch.options import OrchestrationLimits
from kernorch.orchestrate import blp
from kernorch.orchestrate.blp import instance_key, solve_blp
from kernorch.orchestrate.candidates import enumerate_candidates
from kernorch.orchestrate.pruning import LinearEpilogues
from kernorch.orchestrate.subgraph import Subgraph, build_subgraphs

T = TensorType((4,), "float32")


def random_dag(rng: random.Random, size: int) -> Graph:
    """Elementwise primitives; each node reads 1-2 earlier values (or the graph input)."""
    graph = Graph(inputs=["x"], types={"x": T})
    values = ["x"]
    for i in range(size):
        arity = 1 if rng.random() < 0.4 or len(values) < 2 else 2
        inputs = tuple(rng.sample(values, arity))
        out = f"v{i}"
        graph.nodes.append(Node("exp" if arity == 1 else "add", inputs, (out,)))
        graph.types[out] = T
        values.append(out)
    consumed = {v for n in graph.nodes for v in n.inputs}
    sinks = [n.outputs[0] for n in graph.nodes if n.outputs[0] not in consumed]
    extra = [n.outputs[0] for n in graph.nodes if rng.random() < 0.15]
    graph.outputs = sorted(set(sinks + extra))
    return graph


def oracle(kernels: list[CandidateKernel], costs: list[float], required: set[str], available: set[str]) -> float:
    start = frozenset(available)
    best = {start: 0.0}
    queue = [(0.0, 0, start)]
    counter = 0
    while queue:
        cost, _, have = heapq.heappop(queue)
        if cost > best.get(have, math.inf):
            continue
        if required <= have:
            return cost
        for kernel, kernel_cost in zip(kernels, costs, strict=True):
            if set(kernel.outputs) <= have or not set(kernel.inputs) <= have:
                continue
            grown = have | set(kernel.outputs)
            if cost + kernel_cost < best.get(grown, math.inf):
                best[grown] = cost + kernel_cost
                counter += 1
                heapq.heappush(queue, (cost + kernel_cost, counter, grown))
    return math.inf


def candidates_for(graph: Graph, limits: OrchestrationLimits) -> tuple[list[CandidateKernel], set[str]]:
    (sub,) = build_subgraphs(graph, [(0, len(graph.nodes))])
    return enumerate_candidates(sub, limits, LinearEpilogues(graph)).kernels, sub.required_outputs


@pytest.mark.parametrize("seed", range(220))
def test_blp_matches_brute_force(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    if seed % 2:  # every value through its "is computed" variable: the aggregated formulation, same optimum
        monkeypatch.setattr(blp, "AGGREGATE_OVER", 0)
    rng = random.Random(seed)
    graph = random_dag(rng, rng.randint(3, 7))
    kernels, required = candidates_for(graph, OrchestrationLimits(max_kernel_size=4))
    # Random costs; every few seeds make fused kernels cheap so multi-output and redundant plans win.
    fused_discount = rng.choice([1.0, 0.5, 0.2])
    costs = [rng.uniform(1, 10) * (fused_discount ** (len(k.nodes) - 1)) for k in kernels]
    if seed % 3 == 0:
        # Tempt the solver: two-node multi-output kernels nearly free, so mutually dependent pairs look best.
        costs = [c * 0.01 if len(k.outputs) > 1 and len(k.nodes) == 2 else c
                 for c, k in zip(costs, kernels, strict=True)]  # fmt: skip
    available = set(graph.inputs)
    expected = oracle(kernels, costs, required, available)
    result = solve_blp(kernels, costs, required, available, time_limit=30)
    assert result.optimal
    assert result.cost == pytest.approx(expected, rel=1e-9, abs=1e-9)
    validate_plan(graph, [kernels[k] for k in result.chosen])


def _mutually_dependent_pairs(kernels: list[CandidateKernel]) -> list[tuple[int, int]]:
    pairs = []
    for i, first in enumerate(kernels):
        for j in range(i + 1, len(kernels)):
            second = kernels[j]
            if set(first.inputs) & set(second.outputs) and set(second.inputs) & set(first.outputs):
                pairs.append((i, j))
    return pairs


def test_random_cyclic_temptations() -> None:
    """Random DAGs where mutually dependent kernel pairs are made almost free: the solver must cut them."""
    cut_cases = 0
    tried = 0
    for seed in range(400):
        rng = random.Random(5000 + seed)
        graph = random_dag(rng, rng.randint(5, 8))
        kernels, required = candidates_for(graph, OrchestrationLimits(max_kernel_size=3))
        pairs = _mutually_dependent_pairs(kernels)
        if not pairs:
            continue
        tried += 1
        tempting = set(rng.choice(pairs))
        costs = [0.01 if i in tempting else rng.uniform(1, 10) for i in range(len(kernels))]
        result = solve_blp(kernels, costs, required, set(graph.inputs), time_limit=30)
        assert result.cost == pytest.approx(oracle(kernels, costs, required, set(graph.inputs)), rel=1e-9)
        validate_plan(graph, [kernels[k] for k in result.chosen])
        cut_cases += result.lazy_cuts > 0
        if tried == 60:
            break
    assert tried == 60
    assert cut_cases >= 10, f"only {cut_cases} of {tried} cases needed a cut: the family does not tempt"


def _graph(edges: dict[str, tuple[str, ...]], outputs: list[str]) -> Graph:
    graph = Graph(inputs=["x"], outputs=outputs, types={"x": T})
    for name, inputs in edges.items():
        graph.nodes.append(Node("add" if len(inputs) == 2 else "exp", inputs, (name,)))
        graph.types[name] = T
    return graph


def test_redundancy_wins_figure_4() -> None:
    """p1 feeds three consumers: running p1 inside each consumer's kernel beats materializing it."""
    graph = _graph({"p1": ("x",), "a": ("p1",), "b": ("p1",), "c": ("p1",)}, ["a", "b", "c"])
    kernels, required = candidates_for(graph, OrchestrationLimits())
    costs = [10.0 if len(k.nodes) == 1 else 11.0 if len(k.nodes) == 2 and len(k.outputs) == 1 else 100.0
             for k in kernels]  # fmt: skip
    result = solve_blp(kernels, costs, required, {"x"}, time_limit=30)
    chosen = [kernels[k] for k in result.chosen]
    assert result.cost == pytest.approx(33.0)
    assert sum(0 in k.nodes for k in chosen) == 3  # p1 (node 0) executed in three kernels
    assert result.cost == pytest.approx(oracle(kernels, costs, required, {"x"}))


def test_redundancy_loses_when_recompute_is_expensive() -> None:
    graph = _graph({"p1": ("x",), "a": ("p1",), "b": ("p1",), "c": ("p1",)}, ["a", "b", "c"])
    kernels, required = candidates_for(graph, OrchestrationLimits())
    costs = [1.0 if len(k.nodes) == 1 else 50.0 for k in kernels]
    result = solve_blp(kernels, costs, required, {"x"}, time_limit=30)
    assert result.cost == pytest.approx(4.0)
    assert all(len(kernels[k].nodes) == 1 for k in result.chosen)


def test_cyclic_selection_is_cut() -> None:
    """a and c feed both b and d. Kernels {a,b}→(a,b) and {c,d}→(c,d) are cheap and satisfy the paper's
    constraints together, yet each needs the other's first primitive: no order runs them."""
    graph = _graph({"a": ("x",), "c": ("x",), "b": ("a", "c"), "d": ("a", "c")}, ["b", "d"])
    kernels, required = candidates_for(graph, OrchestrationLimits())
    by_nodes = {(k.nodes, frozenset(k.outputs)): i for i, k in enumerate(kernels)}
    # nodes in graph order: a=0, c=1, b=2, d=3
    tempting = {by_nodes[((0, 2), frozenset("ab"))], by_nodes[((1, 3), frozenset("cd"))]}
    costs = [1.0 if i in tempting else 10.0 for i in range(len(kernels))]
    _, stuck = executable_order([kernels[i] for i in tempting], {"x"})
    assert stuck, "the tempting pair must be unexecutable"
    result = solve_blp(kernels, costs, required, {"x"}, time_limit=30)
    assert result.lazy_cuts >= 1
    assert set(result.chosen) != tempting
    assert result.cost == pytest.approx(oracle(kernels, costs, required, {"x"}))
    validate_plan(graph, [kernels[k] for k in result.chosen])


def test_validator_rejects_broken_plans() -> None:
    graph = _graph({"a": ("x",), "b": ("a",), "c": ("b",)}, ["c"])
    first = make_kernel(graph, (0,), ("a",))
    second = make_kernel(graph, (1, 2), ("c",))
    validate_plan(graph, [first, second])
    with pytest.raises(PlanError, match="before any kernel produces it"):
        validate_plan(graph, [second, first])
    with pytest.raises(PlanError, match="never produced"):
        validate_plan(graph, [first])
    with pytest.raises(PlanError, match="does not compute"):
        validate_plan(graph, [first, make_kernel(graph, (1,), ("c",))])
    # a kernel whose primitive needs a value that is not among its inputs
    broken = CandidateKernel((2,), ("a",), ("c",), graph)
    with pytest.raises(PlanError, match="not an input of the kernel"):
        validate_plan(graph, [first, broken])


def test_candidates_are_exactly_the_connected_state_differences() -> None:
    """Theorem 1 cross-check: grown convex node sets == connected differences of two execution states; every
    other candidate is one of them plus an elementwise input it recomputes (candidates.py)."""
    from kernorch.ir.primitives import PRIMITIVES, Kind
    from kernorch.orchestrate.states import enumerate_states
    from kernorch.orchestrate.subgraph import is_convex, iter_bits

    for seed in range(30):
        graph = random_dag(random.Random(1000 + seed), 7)
        (sub,) = build_subgraphs(graph, [(0, len(graph.nodes))])
        limits = OrchestrationLimits(max_kernel_size=100)
        states = enumerate_states(sub, 10_000).states
        differences = {b & ~a for a in states for b in states if a & b == a and a != b}

        def connected(mask: int, sub: Subgraph = sub) -> bool:
            start = mask & -mask
            reached, frontier = start, start
            while frontier:
                grown = 0
                for i in iter_bits(frontier):
                    grown |= (sub.pred_masks[i] | sub.succ_masks[i]) & mask
                frontier, reached = grown & ~reached, reached | grown
            return reached == mask

        expected = {d for d in differences if connected(d)}
        grown = enumerate_candidates(sub, limits, LinearEpilogues(graph))
        found = {sum(1 << sub.local[n] for n in k.nodes) for k in grown.kernels}
        rejected = {sum(1 << sub.local[n] for n in r.nodes) for r in grown.rejected}
        convex = {mask for mask in found if is_convex(sub, mask)}
        assert convex | rejected == expected
        for mask in found - convex:
            assert any(mask & ~(1 << p) in convex and PRIMITIVES[graph.nodes[sub.node_ids[p]].prim].kind ==
                       Kind.ELEMENTWISE for p in iter_bits(mask)), mask  # fmt: skip


def test_costs_are_never_infinite_in_the_model() -> None:
    graph = _graph({"a": ("x",), "b": ("a",)}, ["b"])
    kernels, required = candidates_for(graph, OrchestrationLimits())
    costs = [math.inf if len(k.nodes) == 2 else 1.0 for k in kernels]
    result = solve_blp(kernels, costs, required, {"x"}, time_limit=30)
    assert all(len(kernels[k].nodes) == 1 for k in result.chosen)
    assert np.isfinite(result.cost)


def _renamed(graph: Graph, prefix: str) -> Graph:
    def name(value: str) -> str:
        return prefix + value

    return Graph(inputs=[name(v) for v in graph.inputs], outputs=[name(v) for v in graph.outputs],
                 nodes=[Node(n.prim, tuple(map(name, n.inputs)), tuple(map(name, n.outputs))) for n in graph.nodes],
                 types={name(v): t for v, t in graph.types.items()})  # fmt: skip


def test_an_instance_renamed_has_the_same_key_and_its_solution_by_position_is_optimal_there() -> None:
    rng = random.Random(7)
    graph = random_dag(rng, 7)
    twin = _renamed(graph, "layer2.")
    limits = OrchestrationLimits(max_kernel_size=4)
    kernels, required = candidates_for(graph, limits)
    twin_kernels, twin_required = candidates_for(twin, limits)
    costs = [rng.uniform(1, 10) for _ in kernels]
    key = instance_key(kernels, costs, required, set(graph.inputs))
    assert instance_key(twin_kernels, costs, twin_required, set(twin.inputs)) == key
    result = solve_blp(kernels, costs, required, set(graph.inputs), time_limit=30)
    reused = [twin_kernels[k] for k in result.chosen]
    validate_plan(twin, reused)
    assert result.cost == pytest.approx(oracle(twin_kernels, costs, twin_required, set(twin.inputs)), rel=1e-9)
    # anything the solver sees differently is another instance
    assert instance_key(kernels, [*costs[:-1], costs[-1] * 2], required, set(graph.inputs)) != key
    assert instance_key(kernels, costs, required, set()) != key
    assert instance_key(kernels, costs, required | {graph.nodes[0].outputs[0]}, set(graph.inputs)) != key
    assert instance_key(kernels[:-1], costs[:-1], required, set(graph.inputs)) != key


def test_out_of_time_the_greedy_warm_start_is_the_answer_with_its_gap() -> None:
    """A solver that runs out of time never leaves the model without a plan: the warm start (the greedy plan,
    always executable) is returned, not optimal, saying so; with time, the optimum as before."""
    graph = _graph({"p1": ("x",), "a": ("p1",), "b": ("p1",), "c": ("p1",)}, ["a", "b", "c"])
    kernels, required = candidates_for(graph, OrchestrationLimits())
    costs = [10.0 if len(k.nodes) == 1 else 11.0 if len(k.nodes) == 2 and len(k.outputs) == 1 else 100.0
             for k in kernels]  # fmt: skip
    unfused = [i for i, k in enumerate(kernels) if len(k.nodes) == 1]
    result = solve_blp(kernels, costs, required, {"x"}, time_limit=0.0, warm_start=unfused)
    assert not result.optimal and "greedy plan" in result.status
    assert sorted(result.chosen) == sorted(unfused) and result.cost == pytest.approx(40.0)
    validate_plan(graph, [kernels[k] for k in result.chosen])
    timed = solve_blp(kernels, costs, required, {"x"}, time_limit=30, warm_start=unfused)
    assert timed.optimal and timed.cost == pytest.approx(33.0)


def _feasible_selections(kernels: list[CandidateKernel], costs: list[float], required: set[str],
                         available: set[str]) -> list[tuple[float, frozenset[int]]]:  # fmt: skip
    """Every executable selection writing `required`, by brute force over subsets, with its cost."""
    found = []
    for mask in range(1, 1 << len(kernels)):
        chosen = [k for k in range(len(kernels)) if mask >> k & 1]
        if not required <= available | {v for k in chosen for v in kernels[k].outputs}:
            continue
        if executable_order([kernels[k] for k in chosen], available)[1]:
            continue
        found.append((sum(costs[k] for k in chosen), frozenset(chosen)))
    return found


@pytest.mark.parametrize("seed", range(16))
def test_next_best_selections_match_brute_force(seed: int) -> None:
    """Each next-best selection is the cheapest executable one that leaves out a costly kernel of every selection
    ranked before it (a superset of a ranked plan is that plan with a kernel added, not another plan; dropping a
    free kernel is none either)."""
    rng = random.Random(900 + seed)
    graph = random_dag(rng, rng.randint(3, 4))
    kernels, required = candidates_for(graph, OrchestrationLimits(max_kernel_size=3))
    if len(kernels) > 14:
        pytest.skip("too many candidates to enumerate every subset")
    costs = [rng.uniform(1, 10) * (0.5 ** (len(k.nodes) - 1)) for k in kernels]
    if seed % 2:  # some kernels free (views cost nothing): they do not make a plan another
        costs = [0.0 if rng.random() < 0.3 else c for c in costs]
    available = set(graph.inputs)
    selections = _feasible_selections(kernels, costs, required, available)
    ranked = blp.next_best(kernels, costs, required, available, 30, [solve_blp(kernels, costs, required, available,
                                                                               30)], 3)  # fmt: skip
    if len(ranked) < 2:  # only when the optimum has no costly kernel to leave out
        assert not any(costs[k] > 0 for k in ranked[0].chosen)
    for position in range(1, len(ranked)):
        before = [{k for k in r.chosen if costs[k] > 0} for r in ranked[:position]]
        allowed = [cost for cost, chosen in selections if not any(b <= chosen for b in before)]
        assert ranked[position].cost == pytest.approx(min(allowed), rel=1e-9)
        assert not any(b <= set(ranked[position].chosen) for b in before)
        assert ranked[position].cost >= ranked[position - 1].cost - 1e-12
        validate_plan(graph, [kernels[k] for k in ranked[position].chosen])


def _branch_blocks(blocks: int) -> Graph:
    """mobileone's pattern in elementwise primitives: per block three branches from one value, summed, then one
    more primitive."""
    graph = Graph(inputs=["x"], types={"x": T})
    previous = "x"
    for b in range(blocks):
        branches = [f"b{b}_{j}" for j in range(3)]
        graph.nodes += [Node("exp", (previous,), (branch,)) for branch in branches]
        graph.nodes += [Node("add", (branches[0], branches[1]), (f"s{b}",)),
                        Node("add", (f"s{b}", branches[2]), (f"t{b}",)), Node("exp", (f"t{b}",), (f"r{b}",))]
        graph.types.update({v: T for v in (*branches, f"s{b}", f"t{b}", f"r{b}")})
        previous = f"r{b}"
    graph.outputs = [previous]
    return graph


def _relaxation(kernels: list[CandidateKernel], costs: list[float], required: set[str], available: set[str],
                monkeypatch: pytest.MonkeyPatch) -> float:  # fmt: skip
    """The optimum of the BLP's LP relaxation (the same rows, no integrality), in the model's microseconds."""
    solved: list[highspy.Highs] = []

    def continuous(highs: highspy.Highs, *_: object) -> None:
        solved.append(highs)

    with monkeypatch.context() as patch:
        patch.setattr(highspy.Highs, "changeColsIntegrality", continuous)
        solve_blp(kernels, costs, required, available, time_limit=30)
    return float(solved[0].getInfo().objective_function_value)


def test_every_primitive_a_required_value_needs_is_covered(monkeypatch: pytest.MonkeyPatch) -> None:
    """A row per primitive the outputs depend on (not per value available before), over exactly the kernels
    computing it; with them the relaxation of three branch blocks is the integer optimum (without them it
    covered each block's sum with fusion variants at a fraction each: mobileone_s0's took 28 s to prove)."""
    graph = _branch_blocks(3)
    kernels, required = candidates_for(graph, OrchestrationLimits(max_kernel_size=6))
    costs = [1.0 + 0.2 * len(k.nodes) for k in kernels]
    variables = list(range(len(kernels)))
    rows = blp._primitive_covers(kernels, variables, required, {"x"}, {k: k for k in variables})
    assert len(rows) == len(graph.nodes)
    for node in graph.nodes:
        computing = {k for k in variables if any(p.outputs == node.outputs for p in kernels[k].primitives)}
        assert computing in [set(row) for row in rows]
    available = {"x", "r0"}  # the first block computed before: its primitives need no row
    assert len(blp._primitive_covers(kernels, variables, required, available, {k: k for k in variables})) == 12
    optimum = solve_blp(kernels, costs, required, {"x"}, time_limit=30)
    assert optimum.optimal
    assert _relaxation(kernels, costs, required, {"x"}, monkeypatch) == pytest.approx(optimum.cost * 1e6, rel=1e-6)
    assert optimum.cost == pytest.approx(oracle(kernels, costs, required, {"x"}), rel=1e-9)


# The mutants of the code this file tests, each a one-line change a real bug could make and that these tests must
# catch (`make mutate`: kernorch/devtools/mutate.py collects them)
MUTANTS = [
    # orchestration
    here("BLP dependency rows deleted",
         "            add_row(0.0, infinity, entries)",
         "            pass"),
    here("BLP output rows deleted",
         "add_row(1.0, infinity, {column[j]: 1.0 for j in producers[value]})",
         "pass"),
    here("every set is convex",
         "return (ancestors & descendants & ~mask) == 0",
         "return True",
         file="kernorch/orchestrate/subgraph.py"),
    # whole plans measured: next-best plans, validation, costs in place, 2-D matmul calls
    here("a next-best selection may be an excluded plan again",
         "add_row(-infinity, len(costly) - 1.0, {column[k]: 1.0 for k in costly})",
         "add_row(-infinity, float(len(costly)), {column[k]: 1.0 for k in costly})"),
    here("the BLP leaves out the primitive covers (a weak relaxation: same optima, slow proofs)",
         "        add_row(1.0, infinity, entries)\n    # A chosen kernel's",
         "        pass\n    # A chosen kernel's"),
    here("a primitive cover asks for two kernels computing it (cuts off optimal plans)",
         "        add_row(1.0, infinity, entries)\n    # A chosen kernel's",
         "        add_row(2.0, infinity, entries)\n    # A chosen kernel's"),
    here("the covers' walk goes past values available before the subgraph",
         "if value in available or value not in producer or",
         "if value not in producer or"),
]  # fmt: skip
