"""Execute a plan: buffers allocated once, the native kernels in one generated library, created once.

The plan's generated kernels (fused C and oneDNN library calls, codegen/program/plan.py) are compiled into one
library. At construction its `create` builds every library primitive and packs weights; a call then runs
each stretch of native kernels with one foreign call (ctypes releases the GIL) and any kernel that only the
reference implementation can run (an op no backend generates) in between. No torch on this path.

One executor serves any number of calling threads at once. Everything a call writes — the inputs' and
intermediates' buffers (the arena), the library's created state (scratch buffers, oneDNN primitives and
memory handles, packed weights) and the steps bound to them — is a `Workspace`. A call takes an idle
workspace for itself and returns it afterwards; when every workspace is busy a new one is created, so the
pool grows to the number of callers that ever ran at once (each costs one arena and one copy of the packed
weights) — up to `max_workspaces` when one is given, and while memory lasts; callers beyond that wait for an
idle workspace (they never fail). Constants are shared and never written.
"""

from __future__ import annotations

import ctypes
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from kernorch.codegen.backends import REFERENCE, Backend, choose_backend, plan_views, refuse_native
from kernorch.codegen.program import MAX_VEUS, NativePlan, compile_source, load_library, render_plan
from kernorch.errors import KernorchError
from kernorch.ir import foreign
from kernorch.ir.graph import Graph
from kernorch.ir.kernel import CandidateKernel
from kernorch.ir.primitives import run_primitive
from kernorch.options import RUNTIMES, check_max_workspaces
from kernorch.runtime.memory import (
    aligned_buffer,
    aligned_copy,
    aligned_empty,
    allocate,
    available_bytes,
    check_fits,
    plan_memory,
    workspace_bytes,
)
from kernorch.runtime.reference import check_feeds
from kernorch.runtime.rprogram import RProgramRunner
from kernorch.runtime.threads import thread_count
from kernorch.schedule.hazards import kernel_dependencies, unit_dependencies

PLAN_PREFIX = "kernorch"
Launcher = Callable[[], None]


class KernelFailed(KernorchError):
    """A kernel failed at run time: a gather index out of range, or a library call refused its data."""


class LibraryRefused(KernorchError):
    """A library refused to create one of the plan's kernels (`kernel`: its position, when the message names it)."""

    def __init__(self, message: str, kernel: int | None) -> None:
        super().__init__(message)
        self.kernel = kernel


def generate_source(kernels: list[CandidateKernel]) -> tuple[str, NativePlan]:
    """The plan's translation unit (what `kernels.c` holds) and its description."""
    backends, _ = plan_views(kernels, [_backend(kernel) for kernel in kernels])
    plan = render_plan(PLAN_PREFIX, kernels, backends, tasks=True)
    return plan.source, plan


def _backend(kernel: CandidateKernel) -> Backend:
    backend, reason = choose_backend(kernel)
    if backend is None:
        raise KernorchError(f"no backend can run {kernel.describe()}: {reason}")
    return backend


class NativeLibrary:
    """A compiled plan library with its created state; destroyed with this object."""

    def __init__(self, path: Path, prefix: str, table: ctypes.Array[ctypes.c_void_p], threads: int) -> None:
        self.path = path
        self.cdll = load_library(path)
        self._create = getattr(self.cdll, f"{prefix}_create")
        self._create.restype = ctypes.c_void_p
        self._create.argtypes = [ctypes.c_void_p]
        self._run = getattr(self.cdll, f"{prefix}_run")
        self._run.restype = ctypes.c_int
        self._run.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
        self._destroy = getattr(self.cdll, f"{prefix}_destroy")
        self._destroy.restype = None
        self._destroy.argtypes = [ctypes.c_void_p]
        # rProgram entry: only in a plan rendered with its rTasks (the profiler's one-kernel plans have none)
        self.program = getattr(self.cdll, f"{prefix}_program", None)
        if self.program is not None:
            self.program.restype = ctypes.c_int
            self.program.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                     ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]  # fmt: skip
        error = getattr(self.cdll, f"{prefix}_error")
        error.restype = ctypes.c_char_p
        self.error = lambda: (error() or b"").decode(errors="replace")
        self.table = table
        with thread_count(threads):  # oneDNN sizes some kernels by the thread count it sees at creation
            self.state = self._create(table)
        if not self.state:
            reason = self.error()
            named = re.search(rf"\b{re.escape(prefix)}_k(\d+)\b", reason)
            raise LibraryRefused(f"cannot create the plan's library kernels: {reason}",
                                 int(named.group(1)) if named else None)  # fmt: skip

    def run(self, first: int, last: int) -> int:
        return int(self._run(self.state, self.table, first, last))

    def __del__(self) -> None:
        state, self.state = getattr(self, "state", None), None
        if state:
            self._destroy(state)


class Workspace:
    """What one call writes, held by one call at a time: a buffer per value (constants shared with every other
    workspace, read only), the arena the intermediates share, the library's created state with its own buffer
    table, and the steps bound to them."""

    def __init__(self, executor: PlanExecutor) -> None:
        graph = executor.graph
        self.lock = threading.Lock()
        self.buffers: dict[str, np.ndarray] = dict(executor.constants)
        for name in graph.inputs:  # zeros: valid indices for a gather when the rProgram is calibrated on them
            t = graph.types[name]
            self.buffers[name] = aligned_empty(t.shape, t.dtype)
            self.buffers[name].fill(0)
        # A view kernel's outputs are its input's bytes at an offset (codegen/views.py); intermediate values
        # share one arena by lifetime (runtime/memory.py); graph outputs own their buffers.
        self.arena: np.ndarray | None = None
        if executor.memory is not None:
            self.arena, shared = allocate(graph, executor.memory)
            self.buffers.update(shared)
        for kernel in executor.kernels:
            for name in kernel.outputs:
                if name not in self.buffers and name not in executor.views:
                    t = graph.types[name]
                    self.buffers[name] = aligned_empty(t.shape, t.dtype)
        for name in executor.views:  # after every buffer of its own exists; a chain resolves through its sources
            self._view_buffer(name, executor.views, graph)
        self.library: NativeLibrary | None = None
        if executor.library_path is not None:
            table = (ctypes.c_void_p * max(len(executor.plan.slots), 1))()
            for value, slot in executor.plan.slots.items():
                table[slot] = self.buffers[value].ctypes.data
            self.library = NativeLibrary(executor.library_path, PLAN_PREFIX, table, executor.threads)
        self.home: list[int] = list(self.library.table) if self.library is not None else []  # each slot's buffer
        self.launchers: dict[int, Launcher] = {}  # single kernels: timed in place, or run outside rProgram regions
        self.steps: list[Launcher] = []
        self.rprogram: RProgramRunner | None = None

    def _view_buffer(self, name: str, views: dict[str, tuple[str, int]], graph: Graph) -> np.ndarray:
        if name not in self.buffers:
            source, offset = views[name]
            flat = self._view_buffer(source, views, graph).reshape(-1)  # every buffer is contiguous
            t = graph.types[name]
            self.buffers[name] = flat[offset: offset + t.numel].reshape(t.shape)
        return self.buffers[name]


class PlanExecutor:
    """`runtime`: "kernels" runs the plan kernel by kernel (each kernel's own parallel loops); "rprogram"
    runs it as an rProgram on `threads` vEUs (schedule/), scheduled from times measured in place when the
    executor is built.

    Calls (`executor(feeds)`) are thread-safe: each runs in a workspace of its own (see the module's
    docstring). The other methods (`build_rprogram`, `kernel_times`, `kernel_launcher`) and the attributes
    `buffers`, `library`, `steps` and `arena` are those of the first workspace, for tools that measure or
    inspect a plan; they are not meant to run beside calls."""

    def __init__(self, graph: Graph, kernels: list[CandidateKernel], threads: int = 2, cache_dir: Path | None = None,
                 share_memory: bool = True, runtime: str = "kernels",
                 max_workspaces: int | None = None, backends: Sequence[Backend] | None = None) -> None:  # fmt: skip
        if runtime not in RUNTIMES:
            raise KernorchError(f"unknown runtime {runtime!r}: choose one of {', '.join(RUNTIMES)}")
        self.max_workspaces = check_max_workspaces(max_workspaces)
        self.graph = graph
        self.kernels = kernels
        self.threads = threads
        self.backends: list[Backend] = list(backends or [])  # given: a shape-generic plan's (runtime/generic.py)
        for i, kernel in enumerate(kernels if backends is None else []):
            backend, reason = choose_backend(kernel)
            if backend is None:
                raise KernorchError(f"no backend can run kernel {i} ({kernel.describe()}): {reason}")
            self.backends.append(backend)
        self.backends, self.views = plan_views(kernels, self.backends)
        aliases = {value: source for value, (source, _) in self.views.items()}
        self.memory = plan_memory(graph, kernels, aliases) if share_memory else None
        # Refused in one line before anything is allocated when it cannot fit (the library packs a copy of the
        # weights: counted twice)
        self.workspace_bytes = workspace_bytes(graph, self.memory, self.views)
        weights = sum(graph.types[name].nbytes for name in graph.constants)
        check_fits({"weights": 2 * weights, "arena, inputs and outputs": self.workspace_bytes}, "the plan")
        # Constants are copied once: contiguous, owned by the executor, shared by every workspace and read only
        # (weights are packed from them; a kernel writing one would be a codegen bug, caught by numpy).
        self.constants: dict[str, np.ndarray] = {}
        for name, array in graph.constants.items():
            constant = aligned_copy(np.asarray(array))
            constant.flags.writeable = False
            self.constants[name] = constant
        self.cache_dir = cache_dir
        self.runtime = runtime
        self._pool_lock = threading.Lock()
        self._released = threading.Condition(self._pool_lock)  # a workspace became idle: for callers waiting
        self._waiting = 0  # callers waiting for one (read without the lock by a releasing call: see _release)
        self._creating = 0  # workspaces being created (counted against max_workspaces before they exist)
        self.peak_workspaces = 0  # the most workspaces this executor has held at once
        self._workspaces: list[Workspace] = []
        # Kernel by kernel, the plan is compiled without its rTask variants (half the code: a compile takes half
        # the time); they are compiled when an rProgram is first built. A single-primitive kernel a library
        # refuses to create runs by its reference implementation instead (recorded: backends.refuse_native).
        while True:
            try:
                self._compile(tasks=runtime == "rprogram")
                break
            except LibraryRefused as refusal:
                k = refusal.kernel
                if k is None or not 0 <= k < len(kernels) or not self.backends[k].native or \
                        not refuse_native(kernels[k], str(refusal).removeprefix("cannot create the plan's library "
                                                                             "kernels: ")[:300]):  # fmt: skip
                    raise
                self.backends[k] = REFERENCE
        if runtime == "rprogram":
            self.build_rprogram()

    # -- the first workspace, for tools that measure or inspect the plan -----------------------------------------

    @property
    def buffers(self) -> dict[str, np.ndarray]:
        return self._primary.buffers

    @property
    def library(self) -> NativeLibrary | None:
        return self._primary.library

    @property
    def arena(self) -> np.ndarray | None:
        return self._primary.arena

    @property
    def steps(self) -> list[Launcher]:
        return self._primary.steps

    @property
    def rprogram(self) -> RProgramRunner | None:
        return self._primary.rprogram

    @property
    def workspaces(self) -> int:
        """How many workspaces exist: the most calls that have run at once (at least 1)."""
        return len(self._workspaces)

    def _compile(self, tasks: bool) -> None:
        """Render and compile the plan (with its rTasks or not) and start a new pool of workspaces bound to the
        new library (a call still running in an old one finishes there; the old one is then dropped)."""
        self.plan = render_plan(PLAN_PREFIX, self.kernels, self.backends, tasks=tasks)
        self.source = self.plan.source
        self.library_path = compile_source(self.source, self.cache_dir) if any(self.plan.native) else None
        self._input_slots, self._output_slots = self._bindable(self.views)
        primary = self._new_workspace()
        with self._pool_lock:
            self._primary = primary
            self._workspaces = [primary]
            self.peak_workspaces = max(self.peak_workspaces, 1)

    def _new_workspace(self) -> Workspace:
        workspace = Workspace(self)
        workspace.steps = self._steps(workspace)
        return workspace

    @contextmanager
    def _workspace(self) -> Iterator[Workspace]:
        """An idle workspace, held for the body; a new one when every workspace is busy and the pool may grow
        (fewer than max_workspaces, and memory for one more); else the caller waits for one to become idle —
        it waits, it never fails."""
        workspace: Workspace | None = None
        with self._pool_lock:
            self._waiting += 1  # before the scan: a call releasing after it sees this and wakes us (_release)
            try:
                while workspace is None:
                    workspace = next((w for w in self._workspaces if w.lock.acquire(blocking=False)), None)
                    if workspace is None:
                        count = len(self._workspaces) + self._creating
                        if (self.max_workspaces is None or count < self.max_workspaces) and \
                                self._room_for_another():  # fmt: skip
                            self._creating += 1
                            break
                        self._released.wait(0.1)  # notified on release; the timeout guards a release elsewhere
            finally:
                self._waiting -= 1
            generation = self._primary
        if workspace is None:
            try:
                workspace = self._new_workspace()  # outside the pool's lock: creating packs weights
                workspace.lock.acquire()
            finally:
                with self._pool_lock:
                    self._creating -= 1
                    if workspace is not None and generation is self._primary:  # not if the plan was recompiled
                        self._workspaces.append(workspace)
                        self.peak_workspaces = max(self.peak_workspaces, len(self._workspaces))
                    self._released.notify()
        try:
            yield workspace
        finally:
            self._release(workspace)

    def _release(self, workspace: Workspace) -> None:
        workspace.lock.release()
        if self._waiting:  # read after the release: a waiter counted itself before it scanned (see _workspace)
            with self._pool_lock:
                self._released.notify()

    def _room_for_another(self) -> bool:
        """Whether one more workspace (its buffers and a copy of the packed weights) leaves half the available
        memory free."""
        available = available_bytes()
        weights = sum(array.nbytes for array in self.constants.values())
        return available is None or 2 * (self.workspace_bytes + weights) <= available

    def build_rprogram(self, feeds: Mapping[str, np.ndarray] | None = None) -> RProgramRunner:
        """Calibrate the plan's units in place (on `feeds`, else on whatever the input buffers hold), schedule
        them with the wavefront policy and keep the result as this executor's rProgram."""
        if not self.plan.tasks:  # compiled kernel by kernel until now
            self._compile(tasks=True)
        primary = self._primary
        with primary.lock:
            if feeds is not None:
                for name, array in check_feeds(self.graph, feeds).items():
                    np.copyto(primary.buffers[name], array)
            runner = self._rprogram_runner(primary)
            with thread_count(self.threads):
                runner.build()
            primary.rprogram = runner
        with self._pool_lock:  # the other workspaces take the new schedule on their next call
            for workspace in self._workspaces[1:]:
                workspace.rprogram = None
        return runner

    def _rprogram_runner(self, workspace: Workspace | None = None) -> RProgramRunner:
        if not self.plan.tasks:  # compiled kernel by kernel until now
            self._compile(tasks=True)
        workspace = workspace or self._primary
        units = self.plan.units
        reads: list[list[tuple[int, int]]] = []
        writes: list[list[tuple[int, int]]] = []
        for kernel, backend in zip(self.kernels, self.backends, strict=True):
            touched = (kernel.inputs, kernel.outputs) if backend.runs_code else ([], [])
            reads.append([_interval(workspace.buffers[v]) for v in touched[0]])
            writes.append([_interval(workspace.buffers[v]) for v in touched[1]])
        predecessors = unit_dependencies(units, kernel_dependencies(reads, writes))
        run_kernel = lambda k: self._launcher(k, workspace)()  # noqa: E731
        native = workspace.library
        if native is None or native.program is None:  # only Python kernels: an rProgram of calls
            return RProgramRunner(units, predecessors, self.threads, 0, (ctypes.c_void_p * 1)(), _no_program,
                                  run_kernel, self._native_failure_in(workspace))  # fmt: skip
        return RProgramRunner(units, predecessors, self.threads, native.state, native.table, native.program,
                              run_kernel, self._native_failure_in(workspace))  # fmt: skip

    def _rprogram_of(self, workspace: Workspace) -> RProgramRunner | None:
        """The workspace's runner of the first workspace's schedule (its dependencies are those of the first
        workspace: every workspace lays out its buffers the same way)."""
        chosen = self._primary.rprogram
        if chosen is None or chosen.program is None or workspace is self._primary:
            return workspace.rprogram
        if workspace.rprogram is None:
            runner = self._rprogram_runner(workspace)
            runner.adopt(chosen)
            workspace.rprogram = runner
        return workspace.rprogram

    def kernel_launcher(self, k: int) -> Launcher:
        """Kernel k alone (native: one foreign call), for timing it in place."""
        return self._launcher(k, self._primary)

    def _launcher(self, k: int, workspace: Workspace) -> Launcher:
        """Kernel k alone (native: one foreign call), built once per workspace."""
        if k not in workspace.launchers:
            native = self.plan.native[k]
            workspace.launchers[k] = self._native_step(k, k + 1, workspace) if native else \
                self._python_launcher(k, workspace)  # fmt: skip
        return workspace.launchers[k]

    def _native_failure_in(self, workspace: Workspace) -> Callable[[int], None]:
        def fail(failed: int) -> None:
            library = workspace.library
            assert library is not None
            if failed < 0:
                raise KernelFailed(f"the rProgram was refused: it names a unit or range this plan does not have, "
                                   f"or more than {MAX_VEUS} vEUs")  # fmt: skip
            kernel = failed - 1
            # a generated kernel that failed inside an rProgram region left no message on this thread
            reason = library.error().removeprefix(f"kernel {kernel}: ") or \
                "gather index out of range, or integer division or modulo by zero"  # fmt: skip
            raise KernelFailed(f"kernel {kernel} ({self.kernels[kernel].describe()}): {reason}")

        return fail

    def _steps(self, workspace: Workspace) -> list[Launcher]:
        """Consecutive native kernels run as one foreign call; reference kernels run in between."""
        steps: list[Launcher] = []
        native = self.plan.native
        k = 0
        while k < len(self.kernels):
            if native[k]:
                end = k
                while end < len(self.kernels) and native[end]:
                    end += 1
                steps.append(self._native_step(k, end, workspace))
                k = end
            else:
                steps.append(self._python_launcher(k, workspace))
                k += 1
        return steps

    def _native_step(self, first: int, last: int, workspace: Workspace) -> Launcher:
        library = workspace.library
        assert library is not None
        on_failure = self._native_failure_in(workspace)

        def launch() -> None:
            failed = library.run(first, last)
            if failed:
                on_failure(failed)

        return launch

    def _python_launcher(self, k: int, workspace: Workspace) -> Launcher:
        """Kernel k run by Python: its backend's function, or the reference implementation of its primitive."""
        kernel = self.kernels[k]
        function = self.backends[k].python_kernel(kernel)
        if function is None:
            return self._reference_launcher(kernel, workspace)
        inputs = [workspace.buffers[v] for v in kernel.inputs]
        targets = [workspace.buffers[v] for v in kernel.outputs]
        backend = self.backends[k].name

        def launch() -> None:
            results = function(inputs)
            for target, result in zip(targets, results, strict=True):
                if result.shape != target.shape or result.dtype != target.dtype:
                    raise KernelFailed(f"kernel {k} ({backend}) returned {result.dtype}{list(result.shape)}, "
                                       f"planned {target.dtype}{list(target.shape)}")  # fmt: skip
                np.copyto(target, result)

        return launch

    def _reference_launcher(self, kernel: CandidateKernel, workspace: Workspace) -> Launcher:
        (node,) = kernel.primitives
        inputs = [workspace.buffers[v] for v in node.inputs]
        targets = [workspace.buffers.get(o) for o in node.outputs]
        attrs = node.attr_dict
        run: Callable[[list[np.ndarray]], list[np.ndarray]] = lambda arrays: run_primitive(node.prim, arrays, attrs)
        if node.prim == "onnx_node":  # its onnxruntime session is built now, not on the first call
            run = foreign.prepare(attrs, [self.graph.types[v] for v in node.inputs])

        def launch() -> None:
            try:
                results = run(inputs)
            except (IndexError, RuntimeError, ValueError, KernorchError) as error:  # a bad index, onnxruntime refusing
                message = str(error).strip().splitlines()[0][:300] if str(error).strip() else type(error).__name__
                raise KernelFailed(f"{node.prim} from {node.origin}: {message}") from None
            for target, result in zip(targets, results, strict=True):
                if target is not None:
                    if result.shape != target.shape:
                        raise KernelFailed(f"{node.prim} from {node.origin} returned shape {result.shape}, "
                                           f"planned {target.shape}")  # fmt: skip
                    np.copyto(target, result)

        return launch

    def kernel_times(self, feeds: Mapping[str, np.ndarray], repeats: int = 20) -> list[float]:
        """Median seconds of each kernel measured in place: whole inferences, every kernel timed on its own
        (native kernels one foreign call each), so caches hold what a real inference leaves in them."""
        primary = self._primary
        with primary.lock:
            for name, array in check_feeds(self.graph, feeds).items():
                np.copyto(primary.buffers[name], array)
            launchers = [self._launcher(k, primary) for k in range(len(self.kernels))]
            samples: list[list[float]] = [[] for _ in launchers]
            with thread_count(self.threads):
                for repeat in range(repeats + 1):
                    for k, launch in enumerate(launchers):
                        started = time.perf_counter()
                        launch()
                        if repeat:  # the first inference warms up
                            samples[k].append(time.perf_counter() - started)
        return [float(np.median(s)) for s in samples]

    def _bindable(self, views: dict[str, tuple[str, int]]) -> tuple[dict[str, int], dict[str, int]]:
        """Graph inputs and outputs the native kernels can use in the caller's memory (value -> table slot):
        not those a Python-run kernel touches (its launcher holds our buffer), nor a view or a view's source
        (the view's slot was computed from our buffer), nor an output that is also an input or a constant."""
        if self.library_path is None:
            return {}, {}
        python = {v for k, native in zip(self.kernels, self.plan.native, strict=True) if not native
                  for v in (*k.inputs, *k.outputs)}  # fmt: skip
        tied = python | set(views) | {source for source, _ in views.values()}
        slots = self.plan.slots
        inputs = {v: slots[v] for v in self.graph.inputs if v in slots and v not in tied}
        outputs = {v: slots[v] for v in dict.fromkeys(self.graph.outputs) if v in slots and v not in tied
                   and v not in self.graph.inputs and v not in self.graph.constants}  # fmt: skip
        return inputs, outputs

    def __call__(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run one inference; safe to call from many threads at once. Inputs that are C-contiguous are read
        where they are, and outputs are written straight into the arrays returned (no copies) wherever only
        native kernels touch them."""
        checked = check_feeds(self.graph, feeds)
        primary = self._primary
        if primary.lock.acquire(blocking=False):  # a lone caller: the first workspace, without the pool's walk
            try:
                return self._run(primary, checked)
            finally:
                self._release(primary)
        with self._workspace() as workspace:
            return self._run(workspace, checked)

    def _run(self, workspace: Workspace, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        table = workspace.library.table if workspace.library is not None else None
        buffers = workspace.buffers
        outputs: dict[str, np.ndarray] = {}
        bound: list[int] = []  # slots pointing at the caller's memory: back to `workspace.home` after the call
        try:
            for name, array in feeds.items():
                slot = self._input_slots.get(name)
                flags = array.flags
                if table is not None and slot is not None and flags.c_contiguous and flags.aligned:
                    bound.append(slot)
                    table[slot] = array.ctypes.data
                else:
                    np.copyto(buffers[name], array)
            for name, slot in self._output_slots.items():
                t = self.graph.types[name]
                outputs[name], address = aligned_buffer(t.shape, t.dtype)
                bound.append(slot)
                table[slot] = address  # type: ignore[index]  # slots exist only with a table
            rprogram = self._rprogram_of(workspace) if self.runtime == "rprogram" else None
            with thread_count(self.threads):
                if rprogram is not None:
                    rprogram.run()
                else:
                    for step in workspace.steps:
                        step()
        finally:
            for slot in bound:  # never leave a pointer to the caller's memory in the table
                table[slot] = workspace.home[slot]  # type: ignore[index]
        return {name: outputs[name] if name in outputs else buffers[name].copy() for name in self.graph.outputs}


def _interval(array: np.ndarray) -> tuple[int, int]:
    start = int(array.ctypes.data)
    return start, start + max(int(array.nbytes), 1)


def _no_program(*_: object) -> int:
    return 0
