"""Rewrite engine: rules are small registered functions, one fixed-point driver applies them.

A rule looks at one node (its *root*) through a `RewriteContext` and returns a replacement, a map from
existing values (the root's outputs, sometimes a neighbour's) to new values computed by nodes it
emitted, or None when it does not match. Values are SSA and primitives are pure, so a replacement is
valid on its own: the driver redirects every use of an old value to its new value, drops what became
dead and restores a topological order. A replacement that would create a cycle, or change a value's
type, is refused; graph outputs keep their names.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from kernorch.ir.builder import PrimitiveBuilder
from kernorch.ir.graph import Graph, GraphVerificationError, Node, eliminate_dead_nodes
from kernorch.ir.types import TensorType

Replacement = Mapping[str, str]
RuleFunction = Callable[["RewriteContext"], Replacement | None]


@dataclass(frozen=True)
class RewriteRule:
    name: str
    roots: frozenset[str] | None  # primitives a root may be; None: any
    fn: RuleFunction
    cost_guided: bool  # may make the plan slower: kept only where the orchestrated plan gets cheaper
    doc: str
    follow_up: bool = True  # cost-guided: may also fire unjudged right after another rewrite, at what it created


REWRITE_RULES: dict[str, RewriteRule] = {}


def rewrite_rule(name: str, roots: Iterable[str] | None = None, cost_guided: bool = False,
                 follow_up: bool = True) -> Callable[[RuleFunction], RuleFunction]:  # fmt: skip
    """Register `fn` as rule `name`; its docstring is what `kernorch explain` prints for it. A cost-guided rule
    with `follow_up=False` fires only where the search judged it, never as a follow-up of another rewrite."""

    def register(fn: RuleFunction) -> RuleFunction:
        if name in REWRITE_RULES:
            raise ValueError(f"rewrite rule {name} registered twice")
        doc = " ".join((fn.__doc__ or "").strip().split("\n\n")[0].split())  # the first paragraph
        REWRITE_RULES[name] = RewriteRule(name, frozenset(roots) if roots is not None else None, fn, cost_guided, doc,
                                          follow_up)  # fmt: skip
        return fn

    return register


@dataclass(frozen=True)
class Firing:
    """One applied rewrite: which rule, at which ONNX node, on which value."""

    rule: str
    origin: str
    root: str


class GraphIndex:
    """Producers and consumers of every value, rebuilt after each applied rewrite."""

    def __init__(self, graph: Graph) -> None:
        self.producer: dict[str, int] = {}
        self.consumers: dict[str, list[int]] = {}
        for position, node in enumerate(graph.nodes):
            for value in node.outputs:
                self.producer[value] = position
            for value in dict.fromkeys(node.inputs):
                self.consumers.setdefault(value, []).append(position)


class RewriteContext:
    """What a rule sees: the graph around its root, and a builder for the replacement's nodes.

    Emitted nodes whose inputs are all constants are folded on the spot (like at fission), so a rule
    may compute with constant operands freely: `emit("mul", weight, scale)` becomes a new constant.
    """

    def __init__(self, graph: Graph, index: GraphIndex, position: int, scratch: bool = False) -> None:
        self.graph = graph
        self.position = position
        self.node = graph.nodes[position]
        self._index = index
        # A dry run (scratch) must leave the graph's dicts alone; a real run shares them (no copies).
        types = dict(graph.types) if scratch else graph.types
        constants = dict(graph.constants) if scratch else graph.constants
        self._staging = Graph(name=graph.name, types=types, constants=constants)
        self._builder = PrimitiveBuilder(self._staging)
        self._builder.origin = self.node.origin or "rewrite"
        self.absorbed: list[int] = []  # positions of further nodes the replacement takes over (see `absorb`)

    @property
    def new_nodes(self) -> list[Node]:
        return self._staging.nodes

    def type(self, value: str) -> TensorType:
        return self._staging.types[value]

    def const(self, value: str) -> np.ndarray | None:
        return self._staging.constants.get(value)

    def producer(self, value: str) -> Node | None:
        position = self._index.producer.get(value)
        return None if position is None else self.graph.nodes[position]

    def consumers(self, value: str) -> list[Node]:
        return [self.graph.nodes[p] for p in self._index.consumers.get(value, [])]

    def consumer_positions(self, value: str) -> list[int]:
        return list(self._index.consumers.get(value, []))

    def is_output(self, value: str) -> bool:
        return value in self.graph.outputs

    def single_use(self, value: str) -> bool:
        """Used by exactly one node and not a graph output: its producer may be rewritten in place."""
        return len(self._index.consumers.get(value, [])) == 1 and not self.is_output(value)

    def absorb(self, value: str) -> None:
        """The replacement also takes over the node producing `value`, a node further away than the root's
        neighbours: a cost-guided rule is then judged in a neighbourhood that includes it."""
        position = self._index.producer.get(value)
        if position is not None:
            self.absorbed.append(position)

    def emit(self, prim: str, *inputs: str, **attrs: object) -> str:
        (output,) = self._builder.emit(prim, inputs, attrs)
        return output

    def emit_all(self, prim: str, inputs: Iterable[str], **attrs: object) -> list[str]:
        return self._builder.emit(prim, list(inputs), attrs)

    def constant(self, array: np.ndarray) -> str:
        return self._builder.constant(array)


def topological_order(nodes: list[Node], available: Iterable[str]) -> list[Node] | None:
    """Stable topological order (keeps the current order where it can); None if the nodes form a cycle."""
    defined = set(available)
    waiting_on: dict[str, list[int]] = {}
    missing = [0] * len(nodes)
    produced = {value for node in nodes for value in node.outputs}
    for position, node in enumerate(nodes):
        for value in set(node.inputs):
            if value not in defined and value in produced:
                missing[position] += 1
                waiting_on.setdefault(value, []).append(position)
    ready = [p for p, count in enumerate(missing) if count == 0]
    heapq.heapify(ready)
    order: list[Node] = []
    while ready:
        position = heapq.heappop(ready)
        order.append(nodes[position])
        for value in nodes[position].outputs:
            for waiter in waiting_on.pop(value, []):
                missing[waiter] -= 1
                if missing[waiter] == 0:
                    heapq.heappush(ready, waiter)
    return order if len(order) == len(nodes) else None


def _unused_name(graph: Graph, name: str) -> str:
    suffix = 0
    while f"{name}{suffix or ''}" in graph.types:
        suffix += 1
    return f"{name}{suffix or ''}"


def apply_replacement(graph: Graph, position: int, new_nodes: list[Node], replacement: Replacement) -> bool:
    """Insert `new_nodes` before `position`, redirect uses of replaced values, drop dead nodes.

    Returns False (graph untouched) when the replacement would create a cycle or would give a graph
    output's name to a value that already exists.
    """
    fresh = {value for node in new_nodes for value in node.outputs}
    for old, new in replacement.items():
        if graph.types[old] != graph.types[new]:
            raise GraphVerificationError(f"rewrite replaces {old} ({graph.types[old]}) by {new} ({graph.types[new]})")
    # A graph output keeps its name: the fresh value replacing it takes that name instead.
    take_name: dict[str, str] = {}
    for old, new in replacement.items():
        if old in graph.outputs:
            if new not in fresh or new in take_name:
                return False
            take_name[new] = old
    # The old producer of such an output keeps computing its other outputs; the replaced one becomes a
    # dead value under a new name (dropped with the producer if nothing else of it is used).
    retired = {old: _unused_name(graph, f"{old}#replaced") for old in take_name.values()}

    def resolve(value: str) -> str:
        new = replacement.get(value, value)
        return take_name.get(new, new)

    def redirect(node: Node) -> Node:
        if not any(v in replacement for v in node.inputs) and not any(v in retired for v in node.outputs):
            return node
        return Node(node.prim, tuple(resolve(v) for v in node.inputs),
                    tuple(retired.get(v, v) for v in node.outputs), node.attrs, node.origin)  # fmt: skip

    def rename(node: Node) -> Node:
        if not take_name:
            return node
        return Node(node.prim, tuple(take_name.get(v, v) for v in node.inputs),
                    tuple(take_name.get(v, v) for v in node.outputs), node.attrs, node.origin)  # fmt: skip

    old_nodes = [redirect(n) for n in graph.nodes]
    nodes = [*old_nodes[:position], *(rename(n) for n in new_nodes), *old_nodes[position:]]
    ordered = topological_order(nodes, [*graph.inputs, *graph.constants])
    if ordered is None:
        return False
    for old, dead in retired.items():
        graph.types[dead] = graph.types[old]
    for new, old in take_name.items():
        graph.types[old] = graph.types[new]
    graph.nodes = ordered
    eliminate_dead_nodes(graph)
    return True


def rules_by_root(rules: Iterable[RewriteRule]) -> Callable[[str], list[RewriteRule]]:
    table: dict[str, list[RewriteRule]] = {}
    any_root: list[RewriteRule] = []
    for rule in rules:
        if rule.roots is None:
            any_root.append(rule)
        else:
            for prim in rule.roots:
                table.setdefault(prim, []).append(rule)
    return lambda prim: [*table.get(prim, []), *any_root]


def try_rule(graph: Graph, index: GraphIndex, position: int, rule: RewriteRule,
             allowed: Callable[[RewriteRule, RewriteContext], bool] | None = None) -> bool:  # fmt: skip
    context = RewriteContext(graph, index, position)
    if allowed is not None and not allowed(rule, context):
        return False
    replacement = rule.fn(context)
    return bool(replacement) and apply_replacement(graph, position, context.new_nodes, replacement or {})


def apply_rules(
    graph: Graph,
    rules: Iterable[RewriteRule],
    log: list[Firing] | None = None,
    allowed: Callable[[RewriteRule, RewriteContext], bool] | None = None,
    max_sweeps: int = 50,
) -> tuple[Graph, bool]:
    """Apply `rules` until none matches anywhere (a fixed point); returns (new graph, changed).

    The input graph is not modified. `allowed(rule, context)` may veto a rule at a root.
    """
    graph = eliminate_dead_nodes(graph.copy())
    candidates = rules_by_root(rules)
    changed = False
    budget = 50 * len(graph.nodes) + 1000  # firings: a rule pair that undoes each other must not spin
    for _ in range(max_sweeps):
        swept_clean = True
        index = GraphIndex(graph)
        position = 0
        while position < len(graph.nodes):
            node = graph.nodes[position]
            fired = next((rule for rule in candidates(node.prim) if try_rule(graph, index, position, rule, allowed)),
                         None)  # fmt: skip
            if fired is None:
                position += 1
                continue
            if log is not None:
                log.append(Firing(fired.name, node.origin, node.outputs[0]))
            changed, swept_clean = True, False
            budget -= 1
            if budget < 0:
                raise GraphVerificationError(f"rewrite rules do not converge (last: {fired.name} at {node.origin})")
            index = GraphIndex(graph)  # re-examine this position: the replacement's nodes sit here now
        if swept_clean:
            break
    # a refused replacement (a cycle) may have left folded constants behind
    return eliminate_dead_nodes(graph), changed
