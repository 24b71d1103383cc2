"""The primitive graph: typed values, primitive nodes, and a verifier callable between stages.

Values are named; every value has a static `TensorType`. A value is a graph input, a constant
(with its array) or the output of exactly one node. Nodes are kept in a topological order.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kernorch.ir.types import TensorType

AttrValue = int | float | str | bool | tuple[Any, ...] | None


def freeze_attrs(attrs: Mapping[str, Any] | None) -> tuple[tuple[str, AttrValue], ...]:
    """Attributes as a sorted tuple of (name, value) so nodes are hashable and comparable."""

    def freeze(value: Any) -> AttrValue:
        if isinstance(value, (list, tuple)):
            return tuple(freeze(v) for v in value)
        if isinstance(value, np.generic):
            return value.item()  # type: ignore[no-any-return]
        return value  # type: ignore[no-any-return]

    return tuple(sorted((name, freeze(value)) for name, value in (attrs or {}).items()))


@dataclass(frozen=True, slots=True)
class Node:
    """One primitive application. `origin` names the ONNX node it was fissioned from."""

    prim: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: tuple[tuple[str, AttrValue], ...] = ()
    origin: str = ""

    def attr(self, name: str, default: Any = None) -> Any:
        for key, value in self.attrs:
            if key == name:
                return value
        return default

    @property
    def attr_dict(self) -> dict[str, Any]:
        return dict(self.attrs)


@dataclass
class Graph:
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    types: dict[str, TensorType] = field(default_factory=dict)
    constants: dict[str, np.ndarray] = field(default_factory=dict)
    nodes: list[Node] = field(default_factory=list)
    name: str = "graph"

    def producers(self) -> dict[str, Node]:
        return {out: node for node in self.nodes for out in node.outputs}

    def consumers(self) -> dict[str, list[Node]]:
        users: dict[str, list[Node]] = {}
        for node in self.nodes:
            for value in node.inputs:
                users.setdefault(value, []).append(node)
        return users

    def count_by_kind(self) -> dict[str, int]:
        from kernorch.ir.primitives import PRIMITIVES

        counts: dict[str, int] = {}
        for node in self.nodes:
            kind = PRIMITIVES[node.prim].kind.value
            counts[kind] = counts.get(kind, 0) + 1
        return counts

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)

    def copy(self) -> Graph:
        """A graph a pass may edit without touching this one (constant arrays are shared, never mutated)."""
        return Graph(list(self.inputs), list(self.outputs), dict(self.types), dict(self.constants),
                     list(self.nodes), self.name)  # fmt: skip


def eliminate_dead_nodes(graph: Graph) -> Graph:
    """Drop nodes, constants and types no graph output depends on (e.g. leftovers of folded shape arithmetic)."""
    live = set(graph.outputs)
    kept: list[Node] = []
    for node in reversed(graph.nodes):
        if any(o in live for o in node.outputs):
            kept.append(node)
            live.update(node.inputs)
    graph.nodes = kept[::-1]
    graph.constants = {k: v for k, v in graph.constants.items() if k in live}
    keep_types = live | set(graph.inputs) | {o for n in graph.nodes for o in n.outputs}
    graph.types = {k: v for k, v in graph.types.items() if k in keep_types}
    return graph


class GraphVerificationError(AssertionError):
    """A stage produced an ill-formed graph: a kernorch bug, not a user error."""


def verify(graph: Graph) -> None:
    """Check the invariants every stage must keep; raises GraphVerificationError on the first breach.

    - every value used is defined earlier (graph input, constant or an earlier node's output);
    - each value is defined once; every node's output types are what its primitive infers;
    - constants match their declared types; graph outputs exist.
    """
    from kernorch.ir.primitives import PRIMITIVES

    def fail(message: str) -> None:
        raise GraphVerificationError(f"{graph.name}: {message}")

    defined: set[str] = set()
    for name in graph.inputs:
        if name in defined:
            fail(f"input '{name}' declared twice")
        if name not in graph.types:
            fail(f"input '{name}' has no type")
        defined.add(name)
    for name, array in graph.constants.items():
        if name in defined:
            fail(f"constant '{name}' is also an input")
        if graph.types.get(name) != TensorType.of(array):
            fail(f"constant '{name}' type {graph.types.get(name)} != array {TensorType.of(array)}")
        defined.add(name)
    for node in graph.nodes:
        if node.prim not in PRIMITIVES:
            fail(f"unknown primitive '{node.prim}'")
        for value in node.inputs:
            if value not in defined:
                fail(f"node {node.prim} ({node.origin}) uses '{value}' before it is defined")
        primitive = PRIMITIVES[node.prim]
        inferred = primitive.infer([graph.types[v] for v in node.inputs], node.attr_dict)
        if len(inferred) != len(node.outputs):
            fail(f"node {node.prim} ({node.origin}) has {len(node.outputs)} outputs, infers {len(inferred)}")
        for value, expected in zip(node.outputs, inferred, strict=True):
            if value in defined:
                fail(f"value '{value}' defined twice")
            if graph.types.get(value) != expected:
                fail(f"value '{value}' typed {graph.types.get(value)}, {node.prim} infers {expected}")
            defined.add(value)
    for name in graph.outputs:
        if name not in defined:
            fail(f"graph output '{name}' is never produced")

