"""Measured cost: compile and time candidate kernels on this machine, remembered in SQLite.

Each candidate is isolated into a mini graph (its inputs become random buffers) and keyed by a
structural signature: the generated C (or the library call with its shapes), never value names, so
repeated blocks of a model, and other models with the same kernels, are measured once. Results are
keyed by (signature, machine fingerprint, threads, method) in the profile database (profile_db.py) and
committed as each kernel's last round ends, so a run killed midway resumes without re-measuring what was
finished.

Users' machines are busy, so a measurement is only trusted when it was quiet (contention.py):
kernels are timed in slices of about `SLICE_SECONDS`, and a slice during which other processes used the
CPU, or a kernel whose repeats spread widely, is measured again after waiting for the machine to calm down.
Contention the kernel's accounting does not show is common too: on a shared VM a neighbour thrashing the
last-level cache slowed an L3-bound 1x1 conv from 650 to 1050-1100 µs for seconds at a time, with
/proc/stat quiet and an FMA loop or a DRAM stream at their usual speed. One measurement taken then made
a fused conv + relu look 1.7x its conv alone, and the plan ran the relu as a pass of its own (ResNet-50: 23
such passes). So each kernel is timed in `QUIET_ROUNDS` rounds, each a pass over every kernel being
measured (seconds apart), and its cost is the fastest round's median: contention only ever adds time.
A value that never got a quiet measurement is the fastest run seen and is stored marked as contended; it is
re-measured by a later run on a quiet machine, and `contended` counts them so `optimize` can say so.
"""

from __future__ import annotations

import ctypes
import hashlib
import math
import os
import socket
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kernorch.codegen.backends import Backend, choose_backend, refuse_native, refused_native
from kernorch.codegen.gir import remembering
from kernorch.codegen.program import CFLAGS, NativePlan, compile_source, render_plan, translation_unit
from kernorch.cost.contention import LoadWindow, wait_for_quiet
from kernorch.cost.interface import CostModelBase
from kernorch.cost.model import rejection
from kernorch.cost.profile_db import Measurement, ProfileDatabase, ProfileDatabaseError
from kernorch.cost.remote import decode_kernel, measure_on_ray
from kernorch.cost.traffic import ActivationTraffic
from kernorch.cost.verify import output_mismatch
from kernorch.errors import KernorchError
from kernorch.ir.graph import Graph
from kernorch.ir.kernel import CandidateKernel, make_kernel
from kernorch.ir.structure import Structure, Structures
from kernorch.machine import fingerprint
from kernorch.runtime.feeds import seeded_feeds
from kernorch.runtime.memory import ALIGNMENT, aligned_copy, aligned_empty
from kernorch.runtime.threads import thread_count
from kernorch.runtime.timing import Timing, time_call

__all__ = ["ProfileDatabase", "ProfileDatabaseError", "ProfiledCostModel", "isolate", "signature"]

BATCH = 150  # C kernels compiled per translation unit
COMPILE_JOBS = os.cpu_count() or 1  # translation units compiled at once
VIEW_KEY = "view"  # the signature of every view kernel (a reshape alias): costs 0
SLICE_SECONDS = 0.15  # kernels are timed in slices at least this long, each judged quiet or contended
MAX_SPREAD = 0.5  # interquartile range / median above this: the repeats disagree, measure again
QUIET_ROUNDS = 3  # quiet rounds per kernel, each a pass over every kernel measured: the fastest median is kept
ROUND_RUNS = (2, 9)  # timed runs per round, at least and at most: three rounds of 2 reach MIN_REPEATS
ROUND_BUDGET_SECONDS = 0.007  # per kernel and round (the three rounds: about one 20 ms budget)
MAX_ATTEMPTS = QUIET_ROUNDS + 3  # measurements of one kernel before a contended value is kept (marked)
QUIET_WAIT_SECONDS = 2.0  # after a disturbed round, waiting for other processes to leave the CPU
CONTENDED_REPEATS = 60  # under contention, more repeats: the fastest of them is the least disturbed
MIN_REPEATS = 5  # even a kernel longer than the time budget: the median of 3 is ±10 % on a 40 ms conv here


def isolate(kernel: CandidateKernel) -> CandidateKernel:
    """The kernel on a graph of its own: its inputs become graph inputs (random data when timed); constants
    stay constants, since a library call packs constant weights once and runs differently without that."""
    graph = kernel.graph
    nodes = [graph.nodes[i] for i in kernel.nodes]
    mini = Graph(inputs=list(kernel.inputs), outputs=list(kernel.outputs), name="isolated")
    mini.types = {v: graph.types[v] for v in kernel.inputs}
    for node in nodes:
        mini.types.update({o: graph.types[o] for o in node.outputs})
    for value in kernel.inputs:
        if value in graph.constants:
            mini.constants[value] = graph.constants[value]
            mini.inputs.remove(value)
    mini.nodes = nodes
    return make_kernel(mini, tuple(range(len(nodes))), kernel.outputs)


def signature(kernel: CandidateKernel, backend: Backend | None = None) -> tuple[Backend, str]:
    """(backend, sha256 of what determines the kernel's run time: `Backend.signature_text` under its label);
    `backend` when the caller already chose it (choosing describes a generated kernel, which is most of what a
    signature costs)."""
    if backend is None:
        backend, reason = choose_backend(kernel)
        if backend is None:
            raise KernorchError(f"no backend runs {kernel.describe()}: {reason}")
    text = backend.signature_text(kernel)
    label = backend.signature_label
    return backend, hashlib.sha256(f"{label}\n{' '.join(CFLAGS)}\n{text}".encode()).hexdigest()


@dataclass
class _Pending:
    key: str
    kind: Backend
    kernel: CandidateKernel  # on a graph of its own (isolate): what is timed
    candidate: CandidateKernel  # as in the orchestrated graph: what is rendered (the same code)
    fallback: Measurement | None = None  # fastest contended run so far (or a contended value stored before)
    quiet: Measurement | None = None  # fastest quiet round so far (its runs: every quiet round's)
    attempts: int = 0
    quiet_rounds: int = 0
    done: bool = False  # stored, or dropped (a failure)

    @property
    def disturbed(self) -> bool:
        """Whether a round of it was contended (or its repeats disagreed)."""
        return self.attempts > self.quiet_rounds


@dataclass
class ProfiledCostModel(CostModelBase):
    """`cost(candidate)` = measured median seconds on this machine (inf if no backend can run it)."""

    measures = True
    has_signatures = True

    database: ProfileDatabase
    threads: int = 2
    progress: Callable[[Iterable[Any], int], Iterator[Any]] | None = None
    kernel_cache: Path | None = None  # compile cache directory (None: the default cache root)
    name: str = "profile"
    workers: str | None = None  # a Ray address ("" = local instance / RAY_ADDRESS) to measure on; None: here
    machine: str = field(default_factory=fingerprint)
    measured: int = 0  # kernels timed in this session (the rest came from the database)
    from_database: int = 0  # kernels whose time an earlier session (another model, another shape) measured
    measured_remotely: int = 0  # kernels whose value this machine kind's Ray workers measured
    foreign: int = 0  # results from workers of another machine kind, stored apart (not used for this plan)
    remeasured: int = 0  # measurements beyond the planned rounds: a slice was contended or its repeats disagreed
    screen: Callable[[CandidateKernel], str | None] | None = None  # the orchestrator leaves out what it rejects
    contended: set[str] = field(default_factory=set)  # signatures whose value never got a quiet measurement
    # signatures of kernels that failed to compile, that a library refused to create, or that ran wrong: dropped
    # from the plan (infinite cost) with the reason, listed by `kernorch explain --rejected`; never stored
    failures: dict[str, str] = field(default_factory=dict)
    verify: bool = True  # run each native kernel once against the reference interpreter before timing it
    traffic: ActivationTraffic | None = None  # what activations add in place (traffic.py); None: isolated times
    _known: dict[str, float] = field(default_factory=dict)
    _signature_of: dict[Any, str | None] = field(default_factory=dict)  # candidate key -> signature
    # structure (ir/structure.py) -> signature: equal structures are the same code on the same shapes, signed once
    _signature_by_structure: dict[Structure, str | None] = field(default_factory=dict)
    _structures: Structures = field(default_factory=Structures)
    _graph: Graph | None = None
    _together: bool = False  # inside `measuring_together`: `prepare` queues what it would measure
    _queued: dict[str, _Pending] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # the measuring method is part of the key: a value timed once (before rounds) may be a slowdown's, and is
        # measured again rather than trusted
        self.machine = f"{self.machine}|threads={self.threads}|rounds={QUIET_ROUNDS}"

    def pricing(self) -> AbstractContextManager[None]:
        """A block pricing a graph's candidates: the screen, the backend choice and the signatures share
        one description and GIR per candidate (codegen/gir/memo.py)."""
        return remembering()

    def prepare(self, candidates: list[CandidateKernel]) -> None:
        """Measure every candidate not yet in the database (batch-compiled), committing as it goes."""
        pending: dict[str, tuple[Backend, CandidateKernel]] = {}
        for candidate in candidates:
            if candidate.graph is not self._graph:  # candidate keys are node indices: per graph
                self._graph, self._signature_of = candidate.graph, {}
            if candidate.key in self._signature_of:
                continue
            structure = self._structures.of(candidate)
            if structure in self._signature_by_structure:  # a twin's (another layer, the graph before a rewrite)
                self._signature_of[candidate.key] = self._signature_by_structure[structure]
                continue
            backend, _ = choose_backend(candidate)
            if backend is None:
                self._signature_of[candidate.key] = self._signature_by_structure[structure] = None
                continue
            if not backend.runs_code:  # an alias: no code runs, nothing to measure
                self._signature_of[candidate.key] = self._signature_by_structure[structure] = VIEW_KEY
                self._known[VIEW_KEY] = 0.0
                continue
            # generated C and library calls do not depend on where their inputs come from: signed (and compiled)
            # as they are in the graph, which shares the description the screen made; timed isolated
            native = backend.native
            kind, key = signature(candidate if native else isolate(candidate), backend if native else None)
            self._signature_of[candidate.key] = self._signature_by_structure[structure] = key
            if key in self.failures:  # inf, or what its reference implementation took (a single primitive)
                self._known.setdefault(key, math.inf)
            elif key not in self._known and key not in pending and key not in self._queued:
                pending[key] = (kind, candidate)
        stored = self.database.lookup(pending, self.machine)
        for key, measurement in stored.items():
            self._known[key] = measurement.seconds
        # contended rows, and rows from fewer repeats than now required, are measured again (the stored value
        # stays as the fallback)
        missing = [_Pending(key, kind, isolate(kernel), kernel, fallback=stored.get(key))
                   for key, (kind, kernel) in pending.items()
                   if key not in stored or stored[key].contended or stored[key].runs < MIN_REPEATS]  # fmt: skip
        self.from_database += len(stored) - sum(1 for item in missing if item.fallback is not None)
        if missing and self.workers is not None:
            missing = self._measure_on_workers(missing)
        if self._together:  # measured with the rest at the end of the block
            self._queued.update((item.key, item) for item in missing)
        elif missing:
            self._measure(missing)

    @contextmanager
    def measuring_together(self) -> Iterator[None]:
        """A block whose `prepare`d candidates are measured together when it ends: the rounds of each kernel are
        then passes over all of them, seconds apart, not over one subgraph's few (milliseconds apart, inside one
        slowdown). A cost asked inside the block measures what is queued first."""
        if self._together:
            yield
            return
        self._together = True
        try:
            yield
        finally:  # after an exception what is queued stays queued: its signatures are known, so a later `cost`
            self._together = False  # measures it rather than finding no value
        self._measure_queued()

    def _measure_queued(self) -> None:
        queued = list(self._queued.values())
        self._queued.clear()
        if queued:
            self._measure(queued)

    def _measure(self, missing: list[_Pending]) -> None:
        """Compile every kernel of `missing`, then time each in `QUIET_ROUNDS` rounds over all of them."""
        shown = len(missing) * QUIET_ROUNDS  # the bar counts kernel-rounds: every round is as long as the first
        bar = self.progress(iter(range(shown)), shown) if self.progress else None
        size = max(1, min(BATCH, -(-len(missing) // COMPILE_JOBS)))  # at least one batch per compiler
        batches = [missing[start: start + size] for start in range(0, len(missing), size)]
        # every batch is compiled before any is timed, one compiler per core: compiling beside a measurement
        # would disturb it, and one compiler at a time left the other core idle for half the tuning time
        compiled = self._compile_all(batches)
        with thread_count(self.threads):
            rounds = 0
            while any(not item.done for item in missing):
                disturbed = False
                for batch, libraries in zip(batches, compiled, strict=True):
                    todo = [item for item in batch if not item.done]
                    if todo:  # each round creates the kernels anew: one batch's buffers and states at a time
                        disturbed |= self._measure_round(todo, libraries)
                    if bar is not None and rounds < QUIET_ROUNDS:
                        for _ in todo:
                            next(bar, None)
                rounds += 1
                if disturbed and any(not item.done for item in missing):
                    wait_for_quiet(QUIET_WAIT_SECONDS)
        for _ in bar or ():  # kernels dropped as failures skip their later rounds
            pass

    def _measure_on_workers(self, missing: list[_Pending]) -> list[_Pending]:
        """Measure on the Ray cluster; store every result under the machine that produced it. What this machine
        kind's workers measured quietly is done; the rest is returned, to be measured here."""
        assert self.workers is not None
        results = measure_on_ray(self.workers, [item.kernel for item in missing], self.threads,
                                 [item.key for item in missing], measure_payloads, self.progress)  # fmt: skip
        done: set[str] = set()
        for result in results:
            self.database.store(result.signature, result.machine, result.measurement)
            if result.machine != self.machine:
                self.foreign += 1
            elif not result.measurement.contended:
                self._known[result.signature] = result.measurement.seconds
                self.measured_remotely += 1
                done.add(result.signature)
        return [item for item in missing if item.key not in done]

    def _compile_all(self, batches: list[list[_Pending]]) -> list[dict[str, tuple[Path, NativePlan]]]:
        """Per batch, its native kernels as one-kernel plans in one compiled library: key -> (library, plan). A
        batch that does not compile is compiled kernel by kernel, and each kernel that still fails is recorded in
        `failures` (the others are measured as usual)."""

        def build(batch: list[_Pending]) -> dict[str, tuple[Path, NativePlan]]:
            native = [item for item in batch if item.kind.native]
            try:
                return self._compile_unit(native)
            except Exception:  # noqa: BLE001 - one broken kernel must not take the batch with it: find it
                pass
            built: dict[str, tuple[Path, NativePlan]] = {}
            for item in native:
                try:
                    built.update(self._compile_unit([item]))
                except Exception as error:  # noqa: BLE001 - a renderer's or the compiler's refusal: the reason
                    self._fail(item, str(error).splitlines()[0][:300] if isinstance(error, KernorchError)
                               else f"rendering failed: {type(error).__name__}: {error}")  # fmt: skip
            return built

        with ThreadPoolExecutor(max(1, min(COMPILE_JOBS, len(batches)))) as pool:
            return list(pool.map(build, batches))

    def _compile_unit(self, items: list[_Pending]) -> dict[str, tuple[Path, NativePlan]]:
        if not items:
            return {}
        plans = [render_plan(f"p{item.key[:16]}", [item.candidate], [item.kind]) for item in items]
        path = compile_source(translation_unit(plans), self.kernel_cache)
        return {item.key: (path, plan) for item, plan in zip(items, plans, strict=True)}

    def _fail(self, item: _Pending, reason: str) -> None:
        """Drop the kernel: infinite cost, with the reason. A single primitive is not dropped but run by its
        reference implementation from now on (backends.refuse_native), so the model keeps a kernel for it."""
        self.failures[item.key] = reason
        self._known[item.key] = math.inf
        refuse_native(item.kernel, reason)

    def _launchers(self, batch: list[_Pending], libraries: dict[str, tuple[Path, NativePlan]],
                   ) -> dict[str, Callable[[], Any]]:  # fmt: skip
        """One launcher per kernel that can be measured: the native ones from the batch's library (each a
        one-kernel plan, created once per round like a loaded plan, and before its first round run once and
        checked against the reference), reference kernels through the executor. A kernel a library refuses to
        create or that computes a wrong result is recorded in `failures` instead."""
        launchers: dict[str, Callable[[], Any]] = {}
        for item in batch:
            if item.key in self.failures:
                continue  # dropped in an earlier round (or run by its reference implementation: the caller's)
            if not item.kind.native:
                launchers[item.key] = self._executor_launcher(item.kernel)
                continue
            if item.key not in libraries:
                continue  # did not compile: already a failure
            path, plan = libraries[item.key]
            try:
                launch = native_launcher(path, plan, item.kernel, self.threads)
            except KernorchError as error:  # a library that refuses the kernel's descriptors
                self._fail(item, str(error).splitlines()[0][:300])
                continue
            problem = self._verified(item.kernel, launch) if self.verify and not item.attempts else None
            if problem is not None:
                self._fail(item, problem)
                continue
            launchers[item.key] = launch
        return launchers

    @staticmethod
    def _verified(kernel: CandidateKernel, launch: Callable[[], int]) -> str | None:
        """Why the kernel's first run on the profiler's inputs is wrong, or None. A run that stops on its data (a
        gather index, an integer divisor of zero: integer inputs are zeros here) or data the reference refuses
        says nothing about the kernel: it is timed as before."""
        if launch():
            return None
        try:
            return output_mismatch(kernel, launch.keep_alive[0])  # type: ignore[attr-defined]
        except (ArithmeticError, IndexError, ValueError, KernorchError):
            return None

    def _executor_launcher(self, kernel: CandidateKernel) -> Callable[[], Any]:
        from kernorch.runtime.executor import PlanExecutor

        executor = PlanExecutor(kernel.graph, [kernel], self.threads, self.kernel_cache)
        for name, array in _random_inputs(kernel).items():
            np.copyto(executor.buffers[name], array)
        (launch,) = executor.steps
        return launch

    def _measure_round(self, todo: list[_Pending], libraries: dict[str, tuple[Path, NativePlan]]) -> bool:
        """One round over `todo` (a batch's kernels not yet done): True when a slice of it was disturbed."""
        launchers = self._launchers(todo, libraries)
        for item in todo:  # a refused single primitive runs by its reference implementation: timed so
            if item.key in self.failures and refused_native(item.kernel) is not None:
                launchers[item.key] = self._executor_launcher(item.kernel)
            elif item.key not in launchers:
                item.done = True  # did not compile, refused or wrong: a failure, nothing to time
        disturbed = False
        for piece in _slices([item for item in todo if not item.done], launchers):
            with LoadWindow() as window:
                # a kernel measured again under contention gets more repeats: the fastest is the least disturbed
                timings = [(item, time_call(launchers[item.key], min_runs=ROUND_RUNS[0],
                                            max_runs=CONTENDED_REPEATS if item.disturbed else ROUND_RUNS[1],
                                            budget_seconds=ROUND_BUDGET_SECONDS))
                           for item in piece]  # fmt: skip
            for item, timing in timings:
                quiet = self._settle(item, timing, window.contended)
                disturbed |= not quiet
                if item.quiet_rounds >= QUIET_ROUNDS or item.attempts >= MAX_ATTEMPTS:
                    self._store(item)  # every round quiet, or out of attempts: the least disturbed value
                elif not quiet:
                    self.remeasured += 1
        return disturbed

    def _settle(self, item: _Pending, timing: Timing, contended: bool) -> bool:
        """Record one round of `item`; True when it was quiet (its median then a candidate for the cost)."""
        item.attempts += 1
        if contended or timing.spread > MAX_SPREAD:
            item.fallback = _faster(item.fallback, Measurement(timing.best, timing.runs, timing.spread, True))
            return False
        runs = timing.runs + (item.quiet.runs if item.quiet is not None else 0)
        fastest = _faster(item.quiet, Measurement(timing.median, runs, timing.spread, False))
        item.quiet = Measurement(fastest.seconds, runs, fastest.spread, False)
        item.quiet_rounds += 1
        return True

    def _store(self, item: _Pending) -> None:
        """Store the quiet value if there is one, else the fastest contended run (marked). A refused kernel's
        reference time is this process's only: under the native kernel's signature it would mislead the next."""
        measurement = item.quiet or item.fallback
        assert measurement is not None
        item.done = True
        if item.key not in self.failures:
            self.database.store(item.key, self.machine, measurement)
        self._known[item.key] = measurement.seconds
        if measurement.contended:
            self.contended.add(item.key)
        else:
            self.contended.discard(item.key)
        self.measured += 1

    def rejection(self, candidate: CandidateKernel) -> str | None:
        failed = self.failures.get(self._signature_of.get(candidate.key) or "")
        return failed if failed is not None else rejection(candidate)

    def contended_in(self, kernels: Iterable[CandidateKernel]) -> int:
        """How many of `kernels` are costed by a value that never got a quiet measurement."""
        return sum(1 for k in kernels if self._signature_of.get(k.key) in self.contended)

    def cost(self, candidate: CandidateKernel) -> float:
        key = self.signature_of(candidate)
        if key in self._queued:  # asked before the block that queued it ends
            self._measure_queued()
        if key is None:
            return math.inf
        measured = self._known[key]
        return measured + self.traffic.seconds(candidate) if self.traffic and key != VIEW_KEY else measured

    def signature_of(self, candidate: CandidateKernel) -> str | None:
        """The profile key of what `candidate` runs (None if no backend runs it; VIEW_KEY for an alias): kernels
        with one key run the same code on the same shapes, such as a transformer's layers."""
        if candidate.graph is not self._graph or candidate.key not in self._signature_of:
            self.prepare([candidate])
        return self._signature_of[candidate.key]


def _faster(a: Measurement | None, b: Measurement) -> Measurement:
    return b if a is None or b.seconds < a.seconds else a


def _slices(items: list[_Pending], launchers: dict[str, Callable[[], Any]]) -> Iterator[list[_Pending]]:
    """Consecutive groups whose measurement takes about SLICE_SECONDS (one quick run estimates each)."""
    piece: list[_Pending] = []
    expected = 0.0
    for item in items:
        started = time.perf_counter()
        launchers[item.key]()
        once = time.perf_counter() - started  # then a warm-up and the round's runs (time_call)
        expected += once + max(ROUND_RUNS[0] * once, min(ROUND_BUDGET_SECONDS, ROUND_RUNS[1] * once))
        piece.append(item)
        if expected >= SLICE_SECONDS:
            yield piece
            piece, expected = [], 0.0
    if piece:
        yield piece


_POOL_STRIDE = 1024  # floats between the starts of two inputs' values: 4 KB, so every input stays 64-byte aligned
_normal_pool = np.empty(0, dtype=np.float32)


def _normal_values(count: int) -> np.ndarray:
    """`count` standard-normal float32 values, read-only, 64-byte aligned: views of one pool drawn (seeded)
    once per process and grown when a kernel needs more. Drawing every isolated kernel's inputs afresh took
    36 s of segformer_b0's 5.4-minute cold tuning; the kernels only read them."""
    global _normal_pool
    if _normal_pool.size < count:
        size = max(count, 2 * _normal_pool.size)
        raw = np.empty(size + 16, dtype=np.float32)
        start = (-raw.ctypes.data % 64) // 4
        pool = raw[start: start + size]
        pool[:] = np.random.default_rng(0).standard_normal(size, dtype=np.float32)
        pool.setflags(write=False)
        _normal_pool = pool
    return _normal_pool[:count]


def _random_inputs(kernel: CandidateKernel) -> dict[str, np.ndarray]:
    """Inputs of an isolated kernel: floats are standard normal (read-only views of one pool, each input
    starting elsewhere in it), integers zeros (always a valid gather index), bools seeded coin flips."""
    graph = kernel.graph
    types = {name: graph.types[name] for name in graph.inputs}
    feeds = seeded_feeds({n: t for n, t in types.items() if not t.is_float}, {n: 1 for n in types})
    for position, (name, value_type) in enumerate(t for t in types.items() if t[1].is_float):
        offset = position * _POOL_STRIDE
        values = _normal_values(offset + value_type.numel)[offset:].reshape(value_type.shape)
        feeds[name] = values.astype(value_type.dtype, copy=False)
    return feeds


def native_launcher(path: Path, plan: NativePlan, kernel: CandidateKernel, threads: int) -> Callable[[], Any]:
    from kernorch.runtime.executor import NativeLibrary

    graph = kernel.graph
    # on cache lines, as the executor places them (a weight 32 bytes off one made a kernel 1.6x slower)
    buffers: dict[str, np.ndarray] = {n: aligned_copy(np.asarray(a)) for n, a in graph.constants.items()}
    for name, array in _random_inputs(kernel).items():
        buffers[name] = array if array.ctypes.data % ALIGNMENT == 0 else aligned_copy(array)
    for name in kernel.outputs:
        buffers[name] = aligned_empty(graph.types[name].shape, graph.types[name].dtype)
    table = (ctypes.c_void_p * max(len(plan.slots), 1))()
    for value, slot in plan.slots.items():
        table[slot] = buffers[value].ctypes.data
    library = NativeLibrary(path, plan.prefix, table, threads)

    def launch() -> int:
        return library.run(0, 1)

    launch.keep_alive = (buffers, library)  # type: ignore[attr-defined]  # buffers and state live with the launcher
    return launch


def measure_payloads(payloads: Sequence[dict[str, Any]], threads: int) -> dict[str, Any]:
    """What a Ray worker runs (cost/remote.py): measure the kernels here, return this machine's fingerprint and
    the measurements."""
    kernels = [decode_kernel(p) for p in payloads]
    with tempfile.TemporaryDirectory(prefix="kernorch-worker-") as scratch:
        database = ProfileDatabase(Path(scratch) / "profiles.sqlite")
        model = ProfiledCostModel(database, threads)
        model.prepare(kernels)
        keys = [signature(isolate(k))[1] for k in kernels]
        found = database.lookup(keys, model.machine)
    rows = [[key, m.seconds, m.runs, m.spread, m.contended] for key, m in found.items()]
    return {"machine": model.machine, "results": rows, "worker": f"{socket.gethostname()}:{os.getpid()}"}
