"""The rewrite stage: clean-up and algebraic rules to a fixed point, then cost-guided substitutions.

A cost-guided rule can make the plan slower, so every place it matches (a *site*) is judged on its
own: the site's neighbourhood is cut out as a small graph and orchestrated before and after the
rewrite (together with the follow-up rewrites the new nodes enable, e.g. a ones-vector matmul merging
with its neighbour) under the active cost model; the rewrite is kept only when that local plan gets
cheaper. The search stops when every site was tried or the time budget is spent; each trial is
reported.
"""

from __future__ import annotations

import hashlib
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from kernorch.ir.graph import Graph, verify
from kernorch.options import DEFAULT_REWRITE_BUDGET_SECONDS
from kernorch.rewrite import rules as _rules  # noqa: F401  (registers every rule)
from kernorch.rewrite.engine import (
    REWRITE_RULES,
    Firing,
    GraphIndex,
    RewriteContext,
    RewriteRule,
    apply_rules,
    rules_by_root,
    try_rule,
)

# A cost-guided rewrite must make its neighbourhood's plan at least this much cheaper (measurement noise;
# kernels the rewrite leaves alone have the same cached cost before and after).
MIN_RELATIVE_GAIN = 0.005
# Data-flow hops around a site's nodes that are orchestrated to judge it: two reach the producers and
# consumers a fused kernel could share with it; every further hop multiplies the candidate kernels.
WINDOW_RADIUS = 2
WINDOW_MAX_NODES = 32


@dataclass(frozen=True)
class Trial:
    rule: str
    origin: str
    root: str
    cost_before: float
    cost_after: float
    kept: bool
    follow_ups: tuple[str, ...]
    reused: bool = False  # an identical neighbourhood (e.g. the same layer, repeated) was judged before


@dataclass
class RewriteReport:
    fired: list[Firing] = field(default_factory=list)
    trials: list[Trial] = field(default_factory=list)
    untried_sites: int = 0
    seconds: float = 0.0
    nodes_before: int = 0
    nodes_after: int = 0
    cost_guided: bool = False  # False: no cost model was given, cost-guided rules were not tried

    def fired_counts(self) -> dict[str, int]:
        return dict(Counter(f.rule for f in self.fired).most_common())

    def summary(self) -> str:
        counts = ", ".join(f"{rule} ×{n}" for rule, n in self.fired_counts().items()) or "none"
        text = f"rewrites: {len(self.fired)} fired ({counts}); {self.nodes_before} → {self.nodes_after} primitives"
        if self.cost_guided:
            kept = sum(t.kept for t in self.trials)
            reused = sum(t.reused for t in self.trials)
            text += f"; cost-guided: {len(self.trials)} site(s) tried"
            text += f" ({reused} judged like an identical one)" if reused else ""
            text += f", {kept} kept"
            if self.untried_sites:
                text += f", {self.untried_sites} untried (time budget spent)"
        return text + f"; {self.seconds:.1f} s"

    def to_json(self) -> dict[str, Any]:
        return {
            "fired": self.fired_counts(), "nodes_before": self.nodes_before, "nodes_after": self.nodes_after,
            "seconds": round(self.seconds, 3), "untried_sites": self.untried_sites,
            "trials": [{"rule": t.rule, "origin": t.origin, "cost_before": t.cost_before, "cost_after": t.cost_after,
                        "kept": t.kept, "follow_ups": list(t.follow_ups)} for t in self.trials],
        }  # fmt: skip


def safe_rules() -> list[RewriteRule]:
    return [rule for rule in REWRITE_RULES.values() if not rule.cost_guided]


def cost_guided_rules() -> list[RewriteRule]:
    return [rule for rule in REWRITE_RULES.values() if rule.cost_guided]


@dataclass(frozen=True)
class Site:
    """Where a rule matches: its root, the nodes whose values it replaces and those it absorbs (the
    neighbourhood's centres)."""

    rule: RewriteRule
    position: int
    centres: tuple[int, ...]


def find_sites(graph: Graph, rules: Iterable[RewriteRule]) -> list[Site]:
    """Every place one of `rules` matches, found by dry runs that leave the graph alone."""
    candidates = rules_by_root(rules)
    index = GraphIndex(graph)
    sites = []
    for position, node in enumerate(graph.nodes):
        for rule in candidates(node.prim):
            context = RewriteContext(graph, index, position, scratch=True)
            replacement = rule.fn(context)
            if replacement:
                centres = {position, *(index.producer[v] for v in replacement if v in index.producer),
                           *context.absorbed}
                sites.append(Site(rule, position, tuple(sorted(centres))))
    return sites


def apply_at(graph: Graph, rule: RewriteRule, root: str, log: list[Firing]) -> Graph | None:
    """Apply `rule` at the node producing `root`, then every rule to a fixed point, cost-guided ones only at
    nodes the rewrite created (its follow-ups). None if the rule does not apply there."""
    result = graph.copy()
    index = GraphIndex(result)
    position = index.producer.get(root)
    if position is None:
        return None
    node = result.nodes[position]
    existing = set(result.types)
    if not try_rule(result, index, position, rule):
        return None
    log.append(Firing(rule.name, node.origin, root))

    def near_the_change(rule: RewriteRule, context: RewriteContext) -> bool:
        """Follow-ups: a cost-guided rule may fire only at a root within two hops of a new value."""
        if not rule.cost_guided:
            return True
        if not rule.follow_up:
            return False
        node = context.node
        nearby = [*node.outputs, *node.inputs]
        for value in node.inputs:
            producer = context.producer(value)
            nearby += producer.inputs if producer is not None else ()
        return any(value not in existing for value in nearby)

    result, _ = apply_rules(result, [*safe_rules(), *cost_guided_rules()], log, allowed=near_the_change)
    return result


def neighbourhood(graph: Graph, centres: Iterable[int], radius: int = WINDOW_RADIUS,
                  max_nodes: int = WINDOW_MAX_NODES) -> Graph:  # fmt: skip
    """The nodes within `radius` data-flow hops of the `centres` as a graph of their own: values from
    outside are its inputs, values used outside (or graph outputs) its outputs."""
    index = GraphIndex(graph)
    frontier = list(centres)
    chosen = set(frontier)
    position = frontier[0]
    for _ in range(radius):
        reached: list[int] = []
        for p in frontier:
            node = graph.nodes[p]
            neighbours = [index.producer[v] for v in node.inputs if v in index.producer]
            neighbours += [c for v in node.outputs for c in index.consumers.get(v, [])]
            reached += [n for n in neighbours if n not in chosen]
        for n in dict.fromkeys(reached):
            if len(chosen) < max_nodes:
                chosen.add(n)
        frontier = list(dict.fromkeys(reached))
    nodes = [graph.nodes[p] for p in sorted(chosen)]
    produced = {v for node in nodes for v in node.outputs}
    used_outside = {v for p, node in enumerate(graph.nodes) if p not in chosen for v in node.inputs}
    window = Graph(name=f"{graph.name}@{graph.nodes[position].outputs[0]}", nodes=nodes)
    window.inputs = list(dict.fromkeys(v for node in nodes for v in node.inputs
                                       if v not in produced and v not in graph.constants))  # fmt: skip
    window.constants = {v: graph.constants[v] for node in nodes for v in node.inputs if v in graph.constants}
    window.outputs = [v for node in nodes for v in node.outputs if v in used_outside or v in graph.outputs]
    window.types = {v: graph.types[v] for v in [*window.inputs, *window.constants, *produced]}
    return window


def window_signature(window: Graph, root: str) -> str:
    """Equal for neighbourhoods that differ only in value names and weights' values (repeated layers), so
    one pair of orchestrations judges them all."""
    names: dict[str, str] = {}

    def canonical(value: str) -> str:
        constant = window.constants.get(value)
        if constant is not None:
            # Small constants by value (rules test scalars); large ones (weights) only as "uniform c" or not:
            # the most any rule asks of a weight is whether it is all ones or zeros.
            flat = constant.reshape(-1)
            content = flat.tobytes().hex() if flat.size <= 64 else \
                f"uniform {flat[0]}" if np.all(flat == flat[0]) else "varied"  # fmt: skip
            return f"const {constant.dtype}{constant.shape} {content}"
        return names.setdefault(value, f"%{len(names)}")

    lines = [f"in {canonical(v)} {window.types[v]}" for v in window.inputs]
    lines += [f"{n.prim} {n.attrs} ({', '.join(map(canonical, n.inputs))}) -> {', '.join(map(canonical, n.outputs))}"
              for n in window.nodes]  # fmt: skip
    lines.append(f"out {', '.join(map(canonical, window.outputs))} root {canonical(root)}")
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def rewrite(
    graph: Graph,
    plan_cost: Callable[[Graph], float] | None = None,
    budget_seconds: float = DEFAULT_REWRITE_BUDGET_SECONDS,
    progress: Callable[[str], None] | None = None,
) -> tuple[Graph, RewriteReport]:
    """Optimize the primitive graph. Without `plan_cost` (graph -> cost of its orchestrated plan) the
    cost-guided rules are not tried."""
    started = time.perf_counter()
    report = RewriteReport(nodes_before=len(graph.nodes), cost_guided=plan_cost is not None)
    graph, _ = apply_rules(graph, safe_rules(), report.fired)
    if plan_cost is not None:
        graph = _cost_guided_search(graph, plan_cost, started + budget_seconds, report, progress)
    verify(graph)
    report.nodes_after = len(graph.nodes)
    report.seconds = time.perf_counter() - started
    return graph, report


def _promise(kept: list[bool]) -> float:
    """Estimated chance that the next site of a rule is kept (Laplace's rule of succession)."""
    return (sum(kept) + 1) / (len(kept) + 2)


def next_site(sites: list[Site], outcomes: dict[str, list[bool]]) -> Site:
    """The site to judge next. A rule not judged yet goes first, so a tight budget (a cold profile database
    makes each trial slow) reaches every rule once: ordered by promise alone, a rule kept at its first sites
    took the whole budget, and SegFormer's decode head — the one site of its rule, not reached in 17 trials —
    kept its 8.6 GFLOP fuse conv. Then rules that keep paying off come first, in graph order."""
    return min(sites, key=lambda s: (s.rule.name in outcomes, -_promise(outcomes.get(s.rule.name, [])), s.position))


def _cost_guided_search(graph: Graph, plan_cost: Callable[[Graph], float], deadline: float,
                        report: RewriteReport, progress: Callable[[str], None] | None) -> Graph:  # fmt: skip
    tried: set[tuple[str, str]] = set()
    judged: dict[tuple[str, str], Trial] = {}
    sites = find_sites(graph, cost_guided_rules())
    outcomes: dict[str, list[bool]] = {}  # rule -> kept? per judged site
    while sites:
        site = next_site(sites, outcomes)
        sites.remove(site)
        rule, node = site.rule, graph.nodes[site.position]
        key = (rule.name, node.outputs[0])
        if key in tried:
            continue
        if time.perf_counter() > deadline:
            report.untried_sites = 1 + sum(1 for s in sites if (s.rule.name, graph.nodes[s.position].outputs[0])
                                           not in tried)  # fmt: skip
            break
        tried.add(key)
        window = neighbourhood(graph, site.centres)
        signature = (rule.name, window_signature(window, node.outputs[0]))
        if signature in judged:
            trial = replace(judged[signature], origin=node.origin, root=node.outputs[0], reused=True)
        else:
            follow_ups: list[Firing] = []
            rewritten = apply_at(window, rule, node.outputs[0], follow_ups)
            if rewritten is None:
                continue  # matched in the whole graph but not inside its window (a partner out of reach)
            before, after = plan_cost(window), plan_cost(rewritten)
            trial = Trial(rule.name, node.origin, node.outputs[0], before, after,
                          after < before * (1 - MIN_RELATIVE_GAIN), tuple(f.rule for f in follow_ups[1:]))
            judged[signature] = trial
        report.trials.append(trial)
        outcomes.setdefault(rule.name, []).append(trial.kept)
        if progress is not None:
            progress(f"{rule.name} at {node.origin}: {trial.cost_before * 1e6:.1f} → {trial.cost_after * 1e6:.1f} us "
                     f"{'kept' if trial.kept else 'rejected'}")  # fmt: skip
        if trial.kept:
            applied = apply_at(graph, rule, node.outputs[0], report.fired)
            if applied is not None:
                graph = applied
                sites = [s for s in find_sites(graph, cost_guided_rules())
                         if (s.rule.name, graph.nodes[s.position].outputs[0]) not in tried]  # fmt: skip
    return graph
