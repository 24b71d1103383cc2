"""PrimitiveBuilder: appends typed primitive nodes to a graph, folding all-constant ones on the spot.

Eager folding is what turns the shape arithmetic PyTorch exports (Shape → Gather → Concat → Reshape)
into constants at import: every primitive whose inputs are all constants is evaluated with its
reference implementation instead of being emitted.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from kernorch.ir.graph import Graph, Node, freeze_attrs
from kernorch.ir.primitives import PRIMITIVES, run_primitive
from kernorch.ir.types import TensorType


class PrimitiveBuilder:
    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self._counter = 0
        self.origin = ""

    def fresh_name(self, hint: str) -> str:
        # A rewrite builds on a graph that already has names: skip any that are taken.
        while True:
            self._counter += 1
            name = f"{self.origin or 'v'}/{hint}_{self._counter}"
            if name not in self.graph.types:
                return name

    def type_of(self, value: str) -> TensorType:
        return self.graph.types[value]

    def constant_value(self, value: str) -> np.ndarray | None:
        return self.graph.constants.get(value)

    def constant(self, array: np.ndarray | float | int | bool, dtype: str | None = None, hint: str = "const") -> str:
        data = np.asarray(array)
        if dtype is not None:
            data = data.astype(dtype)
        name = self.fresh_name(hint)
        self.graph.constants[name] = data
        self.graph.types[name] = TensorType.of(data)
        return name

    def emit(self, prim: str, inputs: Sequence[str], attrs: dict[str, Any] | None = None) -> list[str]:
        """Add `prim(inputs)` and return its output value names (folded to constants if possible)."""
        primitive = PRIMITIVES[prim]
        frozen = freeze_attrs(attrs)
        attr_dict = dict(frozen)
        output_types = primitive.infer([self.type_of(v) for v in inputs], attr_dict)
        if inputs and all(v in self.graph.constants for v in inputs):
            results = run_primitive(prim, [self.graph.constants[v] for v in inputs], attr_dict)
            return [self.constant(r.astype(t.dtype, copy=False), hint=prim) for r, t in
                    zip(results, output_types, strict=True)]  # fmt: skip
        outputs = [self.fresh_name(prim) for _ in output_types]
        for name, value_type in zip(outputs, output_types, strict=True):
            self.graph.types[name] = value_type
        self.graph.nodes.append(Node(prim, tuple(inputs), tuple(outputs), frozen, self.origin))
        return outputs
