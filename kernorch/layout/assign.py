"""Choose a layout for every value of the graph at once: an exact 0-1 program on HiGHS.

Candidates: every value may stay row-major; convolutions add channels-last for their activations, and the
candidates spread through every mode of every primitive (a channels-last value makes its elementwise
consumers' outputs channels-last candidates, a reshape that splits the channel axis gives its output the
matching layout, and so on) until nothing new appears (at most MAX_CANDIDATES per value).

Variables: y[v, l] = value v is stored in layout l; m[n, k] = node n runs in mode k; z[v, l, r] = a
transpose of v from l to r is inserted (shared by every consumer needing r). Constraints: one layout per
value, one mode per node, a node's outputs have the layouts its mode produces, z ≥ y[v, l] + (a consumer's
mode needs r) − 1, and graph inputs and outputs are row-major. Objective: measured mode costs (a conv in
NCHW or channels-last) + transpose costs. A tie goes to row-major (ε per non-row-major layout).

Policies: "auto" solves this; "channels-last" forces every convolution channels-last first (the rule
torch.compile uses: channels-last whenever a graph has convolutions) and optimizes the rest; "nchw" keeps
every value row-major.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import highspy
import numpy as np

from kernorch.errors import KernorchError
from kernorch.ir.graph import Graph, Node
from kernorch.layout.layouts import Perm, canonical, identity
from kernorch.layout.modes import CONV_PRIMS, Mode, modes_of
from kernorch.options import LAYOUT_POLICIES as POLICIES

MAX_CANDIDATES = 4
TIE_BREAK = 1e-9  # seconds per value not stored row-major: among equal plans, prefer fewer changes


@dataclass
class Assignment:
    layouts: dict[str, Perm]  # non-constant value -> stored layout
    modes: dict[int, Mode]  # node index -> chosen mode
    cost: float  # objective: mode costs + transposes
    transposes: int  # transposes the layouts need
    nchw_cost: float  # the same objective with every value row-major
    seconds: float = 0.0
    status: str = ""
    candidates: dict[str, list[Perm]] = field(default_factory=dict)


def candidate_layouts(graph: Graph) -> dict[str, list[Perm]]:
    """Layouts worth considering per value, spread from the convolutions through every primitive's modes."""
    fixed = set(graph.inputs)
    candidates: dict[str, list[Perm]] = {v: [identity(t.rank)] for v, t in graph.types.items()
                                         if v not in graph.constants}  # fmt: skip

    def add(value: str, layout: Perm) -> bool:
        if value in graph.constants or value in fixed:
            return False
        layout = canonical(layout, graph.types[value].shape)
        known = candidates[value]
        if layout in known or len(known) >= MAX_CANDIDATES:
            return False
        known.append(layout)
        return True

    changed = True
    while changed:
        changed = False
        for node in graph.nodes:
            for mode in modes_of(graph, node, lambda v: candidates.get(v, [identity(graph.types[v].rank)]),
                                 lambda n, last: 0.0, lambda v, s, t: 0.0):  # fmt: skip
                for value, layout in zip((*node.inputs, *node.outputs), (*mode.inputs, *mode.outputs), strict=True):
                    changed |= add(value, layout)
    return candidates


def assign_layouts(graph: Graph, conv_cost: Callable[[Node, bool], float],
                   transpose_cost: Callable[[str, Perm, Perm], float], policy: str = "auto",
                   time_limit: float = 60.0) -> Assignment:  # fmt: skip
    if policy not in POLICIES:
        raise KernorchError(f"unknown layout policy '{policy}' (choose {', '.join(POLICIES)})")
    started = time.perf_counter()
    if policy == "nchw" or not any(n.prim in CONV_PRIMS for n in graph.nodes):
        candidates = {v: [identity(t.rank)] for v, t in graph.types.items() if v not in graph.constants}
    else:
        candidates = candidate_layouts(graph)

    def cands(value: str) -> list[Perm]:
        return candidates.get(value, [identity(graph.types[value].rank)])

    node_modes: list[list[Mode]] = []
    nchw_cost = 0.0  # every node in its row-major mode, for the report
    for node in graph.nodes:
        modes = [m for m in modes_of(graph, node, cands, conv_cost, transpose_cost)
                 if all(layout in cands(v) for v, layout in zip(node.outputs, m.outputs, strict=True))]  # fmt: skip
        nchw_cost += next(m.cost for m in modes if _row_major(m))
        if policy == "channels-last" and node.prim in CONV_PRIMS and any(m.channels_last for m in modes):
            # every conv reads channels-last (a 1x1 conv run as a matmul may write either layout)
            modes = [m for m in modes if m.reads_channels_last]
        node_modes.append(modes)

    highs = highspy.Highs()
    highs.setOptionValue("output_flag", False)
    # HiGHS (1.16+) keeps one thread scheduler per process, sized by the first solve: every instance must ask
    # for the same count, or the orchestration BLP's later `threads=1` fails ("Not Set", no solution)
    highs.setOptionValue("threads", 1)
    highs.setOptionValue("time_limit", float(time_limit))
    columns: list[float] = []  # objective per column

    def column(cost: float) -> int:
        highs.addVar(0.0, 1.0)
        columns.append(cost)
        return len(columns) - 1

    def row(lower: float, upper: float, entries: dict[int, float]) -> None:
        highs.addRow(lower, upper, len(entries), list(entries), list(entries.values()))

    y = {(v, layout): column(0.0 if layout == identity(len(layout)) else TIE_BREAK)
         for v, layouts in candidates.items() for layout in layouts}  # fmt: skip
    for v, layouts in candidates.items():
        row(1.0, 1.0, {y[v, layout]: 1.0 for layout in layouts})
    m = {(n, k): column(mode.cost) for n, modes in enumerate(node_modes) for k, mode in enumerate(modes)}
    for n, modes in enumerate(node_modes):
        row(1.0, 1.0, {m[n, k]: 1.0 for k in range(len(modes))})
        for position, value in enumerate(graph.nodes[n].outputs):
            for layout in cands(value):
                entries = {y[value, layout]: 1.0}
                for k, mode in enumerate(modes):
                    if mode.outputs[position] == layout:
                        entries[m[n, k]] = entries.get(m[n, k], 0.0) - 1.0
                row(0.0, 0.0, entries)
    # transposes: z[v, l, r] when v is stored in l and some consumer (or the graph output) needs r
    needs: dict[tuple[str, Perm], list[dict[int, float]]] = {}
    for n, modes in enumerate(node_modes):
        for position, value in enumerate(graph.nodes[n].inputs):
            if value in graph.constants:
                continue
            by_layout: dict[Perm, dict[int, float]] = {}
            for k, mode in enumerate(modes):
                by_layout.setdefault(mode.inputs[position], {})[m[n, k]] = 1.0
            for required, entries in by_layout.items():
                needs.setdefault((value, required), []).append(entries)
    for value in graph.outputs:
        if value not in graph.constants:
            needs.setdefault((value, identity(graph.types[value].rank)), []).append({})
    z: dict[tuple[str, Perm, Perm], int] = {}
    for (value, required), requirements in needs.items():
        for layout in cands(value):
            if layout == required:
                continue
            key = (value, layout, required)
            if key not in z:
                z[key] = column(transpose_cost(value, layout, required))
            for entries in requirements:
                # z ≥ y[v, l] + Σ(modes needing r) − 1; with no entries (a graph output) z ≥ y[v, l]
                coefficients = {z[key]: 1.0, y[value, layout]: -1.0}
                for col, coefficient in entries.items():
                    coefficients[col] = coefficients.get(col, 0.0) - coefficient
                row(-1.0 if entries else 0.0, highspy.kHighsInf, coefficients)
    highs.changeColsCost(len(columns), np.arange(len(columns), dtype=np.int32), np.array(columns))
    highs.changeColsIntegrality(len(columns), np.arange(len(columns), dtype=np.int32),
                                np.array([highspy.HighsVarType.kInteger] * len(columns)))  # fmt: skip
    highs.run()
    status = highs.modelStatusToString(highs.getModelStatus())
    solution = highs.getSolution().col_value
    if len(solution) != len(columns) or highs.getInfo().primal_solution_status != 2:
        raise KernorchError(f"the layout assignment found no solution ({status})")
    chosen_layouts = {v: layout for (v, layout), col in y.items() if solution[col] > 0.5}
    chosen_modes = {n: node_modes[n][k] for (n, k), col in m.items() if solution[col] > 0.5}
    cost = sum(columns[c] * solution[c] for c in range(len(columns)))
    transposes = sum(1 for col in z.values() if solution[col] > 0.5)
    return Assignment(chosen_layouts, chosen_modes, cost, transposes, nchw_cost, time.perf_counter() - started, status,
                      candidates)  # fmt: skip


def _row_major(mode: Mode) -> bool:
    return all(layout == identity(len(layout)) for layout in (*mode.inputs, *mode.outputs))
