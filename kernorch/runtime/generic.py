"""Run a shape-generic plan: one compiled plan for every size of a range, the sizes given per call.

The plan is laid out for the range's largest sizes (`GenericLayout.largest`): its arena, every value's buffer and
scratch are allocated for them once. A call at smaller sizes uses the same buffers: each value occupies the
first elements of its buffer, contiguous in its shape at the call's sizes (each value's size at any size of the
range is at most its size at the largest, checked when the plan is built), so no two values that live at once
overlap at any size, and the memory plan holds for all of them. What changes per call:

- the plan's size array (`SIZES_INPUT`, an int64 input of the plan) — the generic kernels' extents, strides and
  offsets are polynomials of it (codegen/generic/);
- constants whose values follow the sizes (a position's row of an embedding table, an all-zero mask as long as
  the cache): inputs of the plan, made per call by their generator (shapes/generic.py finds it);
- a view's offset into its source (the layers' caches placed in one concatenated output, each at a multiple of
  the cache length): the view's buffer pointer in the plan's table, per call;
- inputs read where the caller's arrays are (as any plan does), outputs allocated at the call's shapes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kernorch.codegen.backends import Backend
from kernorch.codegen.generic import Polynomial
from kernorch.ir.graph import Graph
from kernorch.ir.kernel import CandidateKernel
from kernorch.runtime.executor import PlanExecutor, Workspace
from kernorch.runtime.memory import aligned_buffer
from kernorch.runtime.threads import thread_count

SIZES_INPUT = "ko_sizes"  # the plan's int64 input holding the call's sizes, in `GenericLayout.sizes` order
Generator = Callable[[Mapping[str, int]], np.ndarray]


@dataclass(frozen=True)
class GenericLayout:
    """How a generic plan's values follow the sizes."""

    sizes: tuple[str, ...]  # the sizes that vary, in the order of the size array
    largest: dict[str, int]  # the sizes the plan's buffers are allocated for
    dims: dict[str, tuple[Polynomial, ...]]  # every value's shape
    view_offsets: dict[str, Polynomial] = field(default_factory=dict)  # every view's element offset in its source
    generated: dict[str, Generator] = field(default_factory=dict)  # constants made per call (plan inputs)

    def shape(self, value: str, sizes: Mapping[str, int]) -> tuple[int, ...]:
        return tuple(int(d(sizes)) for d in self.dims[value])


class GenericExecutor(PlanExecutor):
    """A plan executor whose calls give their sizes (`run_at`); kernel by kernel (no rProgram: its schedule is
    calibrated at one size)."""

    def __init__(self, graph: Graph, kernels: list[CandidateKernel], backends: Sequence[Backend],
                 layout: GenericLayout, threads: int = 2, cache_dir: Path | None = None,
                 max_workspaces: int | None = None) -> None:  # fmt: skip
        self.layout = layout
        super().__init__(graph, kernels, threads, cache_dir, runtime="kernels", max_workspaces=max_workspaces,
                         backends=backends)  # fmt: skip
        # the views whose bytes move within their source with the sizes: their table slots are set per call
        self.moving_views = [value for value in self.views
                             if value in self.plan.slots and not layout.view_offsets[value].is_constant]  # fmt: skip

    def run_at(self, sizes: Mapping[str, int], feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One inference at `sizes` (each within the range: the caller checks), the feeds' shapes those the
        model's inputs have at them (the caller checks). Thread-safe like any plan's call."""
        primary = self._primary
        if primary.lock.acquire(blocking=False):
            try:
                return self._run_at(primary, sizes, feeds)
            finally:
                self._release(primary)
        with self._workspace() as workspace:
            return self._run_at(workspace, sizes, feeds)

    def value_at(self, workspace: Workspace, value: str, sizes: Mapping[str, int]) -> np.ndarray:
        """The value's array at `sizes` in the workspace: the first elements of its buffer, or of its source's at
        the view's offset."""
        shape = self.layout.shape(value, sizes)
        count = int(np.prod(shape, dtype=np.int64))
        if value in self.views:
            source, _ = self.views[value]
            offset = self.layout.view_offsets[value](sizes)
            flat = self.value_at(workspace, source, sizes).reshape(-1)
            return flat[offset: offset + count].reshape(shape)
        return workspace.buffers[value].reshape(-1)[:count].reshape(shape)

    def _run_at(self, workspace: Workspace, sizes: Mapping[str, int],
                feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:  # fmt: skip
        layout = self.layout
        table = workspace.library.table if workspace.library is not None else None
        slots = self.plan.slots
        inputs = dict(feeds)
        inputs[SIZES_INPUT] = np.array([sizes[name] for name in layout.sizes], dtype=np.int64)
        for name, generate in layout.generated.items():
            inputs[name] = generate(sizes)
        outputs: dict[str, np.ndarray] = {}
        bound: list[int] = []  # slots moved for this call: back to `workspace.home` after it
        try:
            for name, array in inputs.items():
                slot = self._input_slots.get(name)
                if table is not None and slot is not None and array.flags.c_contiguous and array.flags.aligned:
                    bound.append(slot)
                    table[slot] = array.ctypes.data
                else:
                    np.copyto(self.value_at(workspace, name, sizes), array)
            if table is not None:
                for value in self.moving_views:
                    bound.append(slots[value])
                    table[slots[value]] = self.value_at(workspace, value, sizes).ctypes.data
            for name, slot in self._output_slots.items():
                outputs[name], address = aligned_buffer(layout.shape(name, sizes), self.graph.types[name].dtype)
                bound.append(slot)
                table[slot] = address  # type: ignore[index]  # slots exist only with a table
            with thread_count(self.threads):
                for step in workspace.steps:
                    step()
        finally:
            for slot in bound:
                table[slot] = workspace.home[slot]  # type: ignore[index]
        return {name: outputs[name] if name in outputs else self.value_at(workspace, name, sizes).copy()
                for name in self.graph.outputs}  # fmt: skip

