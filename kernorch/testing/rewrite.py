"""Helpers for rule tests: build a small primitive graph, rewrite it, check it computes the same."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from kernorch.ir.builder import PrimitiveBuilder
from kernorch.ir.graph import Graph, verify
from kernorch.ir.types import TensorType
from kernorch.rewrite import rules as _rules  # noqa: F401  (registers every rule)
from kernorch.rewrite.engine import REWRITE_RULES, Firing, apply_rules
from kernorch.runtime import run_reference

Shape = Sequence[int]


def build(inputs: Mapping[str, Shape], body: Callable[[PrimitiveBuilder], str | Sequence[str]],
          dtype: str = "float32") -> Graph:  # fmt: skip
    """A graph with float inputs of the given shapes whose outputs are what `body` returns."""
    graph = Graph(name="test", inputs=list(inputs))
    for name, shape in inputs.items():
        graph.types[name] = TensorType(tuple(shape), dtype)
    builder = PrimitiveBuilder(graph)
    builder.origin = "test"
    outputs = body(builder)
    graph.outputs = [outputs] if isinstance(outputs, str) else list(outputs)
    verify(graph)
    return graph


def emit(builder: PrimitiveBuilder, prim: str, *inputs: str, **attrs: object) -> str:
    (output,) = builder.emit(prim, inputs, attrs)
    return output


def const(builder: PrimitiveBuilder, array: np.ndarray | float | Sequence[float]) -> str:
    return builder.constant(np.asarray(array, dtype=np.float32))


def rewrite_with(graph: Graph, *rule_names: str) -> tuple[Graph, list[str]]:
    """Apply the named rules to a fixed point; returns the verified graph and the rules that fired."""
    log: list[Firing] = []
    rewritten, changed = apply_rules(graph, [REWRITE_RULES[name] for name in rule_names], log)
    verify(rewritten)
    assert changed == bool(log)
    return rewritten, [firing.rule for firing in log]


def prims(graph: Graph) -> list[str]:
    return [node.prim for node in graph.nodes]


def assert_equivalent(before: Graph, after: Graph, seed: int = 0, rtol: float = 1e-5,
                      away_from_zero: tuple[str, ...] = ()) -> None:  # fmt: skip
    """Same outputs (names, types, values within float-reassociation tolerance) on random inputs; inputs
    named in `away_from_zero` are drawn with |x| in [0.5, 2] (divisors)."""
    assert after.outputs == before.outputs
    assert all(after.types[v] == before.types[v] for v in before.outputs)
    rng = np.random.default_rng(seed)
    feeds = {name: rng.standard_normal(before.types[name].shape).astype(before.types[name].dtype)
             for name in before.inputs}  # fmt: skip
    for name in away_from_zero:
        shape = before.types[name].shape
        feeds[name] = (rng.choice([-1.0, 1.0], shape) * rng.uniform(0.5, 2.0, shape)).astype(before.types[name].dtype)
    expected, actual = run_reference(before, feeds), run_reference(after, feeds)
    for name, value in expected.items():
        scale = float(np.max(np.abs(value))) if value.size else 0.0
        np.testing.assert_allclose(actual[name], value, rtol=rtol, atol=rtol * max(scale, 1.0), err_msg=name)
