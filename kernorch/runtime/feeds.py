"""The one generator of seeded random inputs: for checks, benchmarks, saved plans and profiling; and the one
way a compiled model takes its inputs as arrays or tensors (`call_with_arrays`).

Floats are standard normal; integers are drawn in [0, bound) where a bound is known (token ids inside
the table they index), in {0, 1} for an input named as a mask (`attention_mask`: position ids derived from its
running sum stay inside their table, as with real masks), else in [0, 10); bools are fair coin flips.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from kernorch.errors import InputMismatch
from kernorch.ir.graph import Graph
from kernorch.ir.types import TensorType

DEFAULT_INTEGER_BOUND = 10


def seeded_feeds(input_types: Mapping[str, TensorType], index_bounds: Mapping[str, int] | None = None,
                 seed: int = 0) -> dict[str, np.ndarray]:  # fmt: skip
    rng = np.random.default_rng(seed)
    bounds = index_bounds or {}
    feeds: dict[str, np.ndarray] = {}
    for name, value_type in input_types.items():
        # np.asarray: a draw of shape () is a numpy scalar, which has no buffer (a profiled kernel's scalar bool
        # input, DynamicQuantizeLinear's "is the range 0", crashed the profiler)
        if value_type.is_float:
            # drawn in float32 where the type is no wider: a third of the time of float64 draws cast down
            wide = np.dtype(value_type.dtype).itemsize > 4
            drawn = rng.standard_normal(value_type.shape, dtype=np.float64 if wide else np.float32)
            feeds[name] = np.asarray(drawn.astype(value_type.dtype, copy=False))
        elif value_type.dtype == "bool":
            feeds[name] = np.asarray(rng.random(value_type.shape) < 0.5)
        else:
            bound = bounds.get(name, 2 if "mask" in name.lower() else DEFAULT_INTEGER_BOUND)
            feeds[name] = np.asarray(rng.integers(0, bound, value_type.shape).astype(value_type.dtype))
    return feeds


# Primitives that move index values without changing them: a gather index may reach its graph input through them.
_INDEX_PRESERVING = {"reshape", "transpose", "expand", "slice", "identity"}


def gather_index_bounds(graph: Graph) -> dict[str, int]:
    """Graph inputs used as gather indices (possibly reshaped on the way), each bounded by the size of the
    axis it indexes."""
    producers = graph.producers()
    bounds: dict[str, int] = {}
    for node in graph.nodes:
        if node.prim != "gather":
            continue
        index = node.inputs[1]
        while index in producers and producers[index].prim in _INDEX_PRESERVING:
            index = producers[index].inputs[0]
        if index in graph.inputs:
            size = graph.types[node.inputs[0]].shape[node.attr("axis")]
            bounds[index] = min(bounds.get(index, size), size)
    return bounds


def graph_feeds(graph: Graph, seed: int = 0, index_bounds: Mapping[str, int] | None = None) -> dict[str, np.ndarray]:
    """Seeded inputs for a primitive graph (a saved plan has no ONNX model to look at)."""
    bounds = gather_index_bounds(graph)
    bounds.update(index_bounds or {})
    return seeded_feeds({name: graph.types[name] for name in graph.inputs}, bounds, seed)


class ArrayModel:
    """What a compiled model (CPU plan or GPU plan) offers callers: its inputs and outputs by name, `run` on named
    arrays, and `__call__` on arrays or tensors positionally or by name (`call_with_arrays`)."""

    graph: Graph

    @property
    def input_names(self) -> list[str]:
        return list(self.graph.inputs)

    @property
    def output_names(self) -> list[str]:
        return list(self.graph.outputs)

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Inputs positionally (graph order) or by name, as numpy arrays or torch tensors.
        Returns one array (or tensor, matching the inputs) per output: a single value or a tuple."""
        return call_with_arrays(self.run, self.input_names, self.output_names, args, kwargs)


def call_with_arrays(run: Callable[[dict[str, np.ndarray]], Mapping[str, np.ndarray]], input_names: Sequence[str],
                     output_names: Sequence[str], args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:  # fmt: skip
    """A model's `__call__`: inputs positionally or by name, numpy arrays or torch tensors, through `run` (named
    arrays in and out); one output alone or a tuple, as tensors when the inputs were."""
    if len(args) > len(input_names):
        raise InputMismatch(f"{len(args)} inputs given, the model takes {len(input_names)}")
    feeds = dict(zip(input_names, args, strict=False))
    feeds.update(kwargs)
    as_torch = any(type(v).__module__.startswith("torch") for v in feeds.values())
    arrays = {name: (value.detach().cpu().numpy() if hasattr(value, "detach") else np.asarray(value))
              for name, value in feeds.items()}  # fmt: skip
    outputs = run(arrays)
    results: list[Any] = [outputs[name] for name in output_names]
    if as_torch:
        import torch

        results = [torch.from_numpy(r) for r in results]
    return results[0] if len(results) == 1 else tuple(results)
