"""Measured cost: compile and time candidate kernels on this machine, remembered in SQLite.

Each candidate is isolated into a mini graph (its inputs become random buffers) and keyed by a
structural signature: the generated C (or the library call with its shapes), never value names, so
repeated blocks of a model, and other models with the same kernels, are measured once. Results are
keyed by (signature, machine fingerprint) in a WAL-mode SQLite database and committed as they are
measured, so a run killed midway resumes without re-measuring what was finished.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import math
import os
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kernorch.codegen.backends import choose_backend, render_c
from kernorch.codegen.c_renderer import PRELUDE
from kernorch.codegen.compiler import CFLAGS, compile_source, load_library
from kernorch.cost.analytic import _fingerprint
from kernorch.errors import KernorchError
from kernorch.ir.graph import Graph
from kernorch.orchestrate.kernel import CandidateKernel, make_kernel

BATCH = 150  # C kernels compiled per translation unit


class ProfileDatabaseError(KernorchError):
    """The tuning database is corrupt or not a kernorch database."""


def isolate(kernel: CandidateKernel) -> CandidateKernel:
    """The kernel on a graph of its own: its inputs become graph inputs (random data when timed)."""
    graph = kernel.graph
    nodes = [graph.nodes[i] for i in kernel.nodes]
    mini = Graph(inputs=list(kernel.inputs), outputs=list(kernel.outputs), name="isolated")
    mini.types = {v: graph.types[v] for v in kernel.inputs}
    for node in nodes:
        mini.types.update({o: graph.types[o] for o in node.outputs})
    # constants the library call relies on structurally (a bias) stay constants
    for value in kernel.inputs:
        if value in graph.constants and graph.types[value].numel <= 4096:
            mini.constants[value] = graph.constants[value]
            mini.inputs.remove(value)
    mini.nodes = nodes
    return make_kernel(mini, tuple(range(len(nodes))), kernel.outputs)


def signature(kernel: CandidateKernel) -> tuple[str, str]:
    """(backend, sha256 of what determines the kernel's run time)."""
    backend, _ = choose_backend(kernel)
    if backend == "c":
        text = render_c("k", kernel)
    else:
        graph = kernel.graph
        text = json.dumps({
            "nodes": [(n.prim, n.attrs, [str(graph.types[v]) for v in n.inputs],
                       [v in graph.constants for v in n.inputs]) for n in kernel.primitives],
            "outputs": [str(graph.types[v]) for v in kernel.outputs],
        }, default=str)  # fmt: skip
    return str(backend), hashlib.sha256(f"{backend}\n{' '.join(CFLAGS)}\n{text}".encode()).hexdigest()


class ProfileDatabase:
    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.connection = sqlite3.connect(str(path))
            self.connection.execute("PRAGMA journal_mode=WAL")
            check = self.connection.execute("PRAGMA quick_check").fetchone()
            if not check or check[0] != "ok":
                raise sqlite3.DatabaseError(str(check))
            self.connection.execute(
                "CREATE TABLE IF NOT EXISTS measurements (signature TEXT NOT NULL, machine TEXT NOT NULL, "
                "seconds REAL NOT NULL, runs INTEGER NOT NULL, measured_at REAL NOT NULL, "
                "PRIMARY KEY (signature, machine))"
            )
            self.connection.commit()
        except sqlite3.DatabaseError as error:
            raise ProfileDatabaseError(f"tuning database {path} is corrupt or not SQLite: {error}") from None

    def lookup(self, signatures: Iterable[str], machine: str) -> dict[str, float]:
        found: dict[str, float] = {}
        wanted = list(signatures)
        for start in range(0, len(wanted), 500):
            chunk = wanted[start: start + 500]
            rows = self.connection.execute(
                f"SELECT signature, seconds FROM measurements WHERE machine = ? AND signature IN "
                f"({','.join('?' * len(chunk))})", [machine, *chunk]).fetchall()  # fmt: skip
            found.update({s: float(t) for s, t in rows})
        return found

    def store(self, signature_: str, machine: str, seconds: float, runs: int) -> None:
        self.connection.execute("INSERT OR REPLACE INTO measurements VALUES (?, ?, ?, ?, ?)",
                                (signature_, machine, seconds, runs, time.time()))  # fmt: skip
        self.connection.commit()  # one row at a time: a killed run loses at most one measurement

    def count(self, machine: str) -> int:
        return int(self.connection.execute("SELECT COUNT(*) FROM measurements WHERE machine = ?",
                                           (machine,)).fetchone()[0])  # fmt: skip


def default_database_path() -> Path:
    return Path(os.environ.get("KERNORCH_CACHE") or Path.home() / ".cache" / "kernorch") / "profiles.sqlite"


def _random_buffers(kernel: CandidateKernel, rng: np.random.Generator) -> dict[str, np.ndarray]:
    graph = kernel.graph
    buffers: dict[str, np.ndarray] = {n: np.array(a, order="C") for n, a in graph.constants.items()}
    for name in graph.inputs:
        t = graph.types[name]
        # integers are zeros: always a valid gather index
        buffers[name] = (rng.standard_normal(t.shape).astype(t.dtype) if t.is_float
                         else np.zeros(t.shape, dtype=t.dtype))  # fmt: skip
    for name in kernel.outputs:
        t = graph.types[name]
        buffers[name] = np.empty(t.shape, dtype=t.dtype)
    return buffers


def _time(launch: Callable[[], Any], budget: float = 0.02, max_runs: int = 25) -> tuple[float, int]:
    """Median seconds of `launch` after one warm-up; at least 3 runs, more while within `budget`."""
    launch()
    times: list[float] = []
    spent = 0.0
    while len(times) < 3 or (spent < budget and len(times) < max_runs):
        start = time.perf_counter()
        launch()
        elapsed = time.perf_counter() - start
        times.append(elapsed)
        spent += elapsed
    return float(np.median(times)), len(times)


@dataclass
class ProfiledCostModel:
    """`cost(candidate)` = measured median seconds on this machine (inf if no backend can run it)."""

    database: ProfileDatabase
    threads: int = 2
    progress: Callable[[Iterable[Any], int], Iterator[Any]] | None = None
    name: str = "profile"
    machine: str = field(default_factory=lambda: _fingerprint())
    measured: int = 0  # kernels timed in this session (the rest came from the database)
    _known: dict[str, float] = field(default_factory=dict)
    _signature_of: dict[Any, str | None] = field(default_factory=dict)  # candidate key -> signature
    _graph: Graph | None = None

    def __post_init__(self) -> None:
        self.machine = f"{self.machine}|threads={self.threads}"

    def prepare(self, candidates: list[CandidateKernel]) -> None:
        """Measure every candidate not yet in the database (batch-compiled), committing as it goes."""
        import torch

        torch.set_num_threads(self.threads)
        pending: dict[str, tuple[str, CandidateKernel]] = {}
        for candidate in candidates:
            if candidate.graph is not self._graph:  # candidate keys are node indices: per graph
                self._graph, self._signature_of = candidate.graph, {}
            if candidate.key in self._signature_of:
                continue
            backend, _ = choose_backend(candidate)
            if backend is None:
                self._signature_of[candidate.key] = None
                continue
            isolated = isolate(candidate)
            kind, key = signature(isolated)
            self._signature_of[candidate.key] = key
            if key not in self._known and key not in pending:
                pending[key] = (kind, isolated)
        self._known.update(self.database.lookup(pending, self.machine))
        missing = [(key, kind, kernel) for key, (kind, kernel) in pending.items() if key not in self._known]
        if not missing:
            return
        rng = np.random.default_rng(0)
        bar = self.progress(missing, len(missing)) if self.progress else None
        for start in range(0, len(missing), BATCH):
            batch = missing[start: start + BATCH]
            c_kernels = [(key, kernel) for key, kind, kernel in batch if kind == "c"]
            library = None
            if c_kernels:
                bodies = [render_c(f"k_{key[:16]}", kernel) for key, kernel in c_kernels]
                source = PRELUDE + "\n".join(bodies)
                library = load_library(compile_source(source))
            for key, kind, kernel in batch:
                seconds, runs = self._measure(kernel, kind, key, library, rng)
                self.database.store(key, self.machine, seconds, runs)
                self._known[key] = seconds
                self.measured += 1
                if bar is not None:
                    next(bar, None)

    def _measure(self, kernel: CandidateKernel, kind: str, key: str, library: ctypes.CDLL | None,
                 rng: np.random.Generator) -> tuple[float, int]:  # fmt: skip
        if kind == "c":
            assert library is not None
            function = getattr(library, f"k_{key[:16]}")
            function.restype = ctypes.c_int
            function.argtypes = [ctypes.c_void_p]
            buffers = _random_buffers(kernel, rng)
            args = (ctypes.c_void_p * max(len(kernel.inputs) + len(kernel.outputs), 1))(
                *[buffers[v].ctypes.data for v in (*kernel.inputs, *kernel.outputs)])  # fmt: skip
            return _time(lambda: function(args))
        from kernorch.runtime.executor import PlanExecutor

        executor = PlanExecutor(kernel.graph, [kernel], self.threads)
        for name, array in _random_buffers(kernel, rng).items():
            if name in kernel.graph.inputs:
                np.copyto(executor.buffers[name], array)
        (launch,) = executor.launchers
        return _time(launch)

    def cost(self, candidate: CandidateKernel) -> float:
        if candidate.graph is not self._graph or candidate.key not in self._signature_of:
            self.prepare([candidate])
        key = self._signature_of[candidate.key]
        return math.inf if key is None else self._known[key]
