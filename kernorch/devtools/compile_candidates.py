"""Render and compile every candidate kernel of models, timing none: a codegen bug that only some candidate
reaches shows up here as a line naming the kernel, not midway through a user's `kernorch optimize`.

Why: a plan test runs the kernels its plan chose, the random-plan tests the shapes they draw. A candidate the
orchestrator enumerates but no test plan chooses (a channels-last reflecting pad with an unrolled channel loop)
is compiled only when the profiler measures it, which on a warm profile database is never. This check
enumerates the candidates as the orchestrator does (with the analytic cost model: no timing, and the rewrite
search and both layouts of `layout="auto"` still run), renders every native one the way the profiler does,
with its rTask variants, and compiles them in translation units of `BATCH` kernels, `COMPILE_JOBS` at once. A
unit that fails is compiled kernel by kernel to name the culprits. Compiled libraries are cached by source,
so a second run only compiles what changed.

With `--run`, each compiled kernel also runs once on the profiler's seeded inputs and its outputs are compared
with the reference interpreter's: a candidate that computes a wrong answer is named too.

`python -m kernorch.devtools.compile_candidates [--run] ../shared/models/*.onnx` exits 1 when any kernel failed, 2 on
a file that is not a model; it says what it is doing per model as it goes.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from kernorch.codegen.backends import Backend, choose_backend
from kernorch.codegen.program import CompileError, NativePlan, compile_source, render_plan, translation_unit
from kernorch.cost.interface import CostModelBase
from kernorch.cost.model import CostModel
from kernorch.cost.profile import BATCH, COMPILE_JOBS, isolate, native_launcher, signature
from kernorch.cost.verify import output_mismatch
from kernorch.errors import KernorchError
from kernorch.ir.kernel import CandidateKernel

RUN_THREADS = 2


@dataclass(frozen=True)
class Failure:
    kernel: str  # what the kernel computes (CandidateKernel.describe)
    error: str  # the compiler's first error line, the renderer's exception, or how the output differs


@dataclass(frozen=True)
class _Item:
    key: str
    backend: Backend
    kernel: CandidateKernel


@dataclass
class CompilingCost(CostModelBase):
    """A cost model that prices like `base` and, on the way, compiles every native candidate it is asked to
    prepare (once per signature: repeated blocks compile once)."""

    base: CostModel
    cache_dir: Path | None = None
    failures: list[Failure] = field(default_factory=list)
    run: bool = False  # also run each kernel once against the reference interpreter
    compiled: int = 0
    _seen: set[str] = field(default_factory=set)
    _pending: list[_Item] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.base.name

    @property
    def pending(self) -> int:
        """Candidates collected and not compiled yet."""
        return len(self._pending)

    def cost(self, candidate: CandidateKernel) -> float:
        return self.base.cost(candidate)

    def prepare(self, candidates: Iterable[CandidateKernel]) -> None:
        """Collect the native candidates not seen yet; `compile_all` compiles them (in few large units: one
        compiler run per prepared window would spend its time on the prelude)."""
        for candidate in candidates:
            backend, _ = choose_backend(candidate)
            if backend is None or not backend.native or not backend.runs_code:  # a view runs no code
                continue
            isolated = isolate(candidate)
            try:
                _, key = signature(isolated, backend)
            except Exception as error:  # a renderer that raises is as broken as C that does not compile
                self.failures.append(Failure(candidate.describe(), f"rendering failed: {error!r}"))
                continue
            if key not in self._seen:
                self._seen.add(key)
                self._pending.append(_Item(key, backend, isolated))

    def compile_all(self) -> None:
        pending, self._pending = self._pending, []
        batches = [pending[start : start + BATCH] for start in range(0, len(pending), BATCH)]
        built: list[tuple[_Item, Path, NativePlan]] = []
        with ThreadPoolExecutor(max(1, min(COMPILE_JOBS, len(batches)))) as pool:
            for failures, compiled in pool.map(self._compile, batches):
                self.failures += failures
                built += compiled
        self.compiled += len(pending)
        if self.run:  # in this thread, one kernel at a time: each runs its own OpenMP parallel loops
            for item, path, plan in built:
                self.failures += self._run(item, path, plan)

    def _compile(self, batch: list[_Item]) -> tuple[list[Failure], list[tuple[_Item, Path, NativePlan]]]:
        """The batch as one unit; if that fails, kernel by kernel to name the broken ones. Returns the failures
        and what compiled (each kernel with its library and plan)."""
        try:
            path, plans = self._compile_unit(batch)
            return [], [(item, path, plan) for item, plan in zip(batch, plans, strict=True)]
        except Exception:
            pass
        failures, built = [], []
        for item in batch:
            try:
                path, (plan,) = self._compile_unit([item])
                built.append((item, path, plan))
            except Exception as error:
                message = str(error) if isinstance(error, CompileError) else f"rendering failed: {error!r}"
                failures.append(Failure(item.kernel.describe(), message))
        return failures, built

    def _compile_unit(self, items: list[_Item]) -> tuple[Path, list[NativePlan]]:
        plans = [render_plan(f"p{item.key[:16]}", [item.kernel], [item.backend], tasks=not item.backend.stateful)
                 for item in items]  # fmt: skip
        return compile_source(translation_unit(plans), self.cache_dir), plans

    def _run(self, item: _Item, path: Path, plan: NativePlan) -> list[Failure]:
        """With `run`: the kernel once on the profiler's seeded inputs, its outputs against the reference
        interpreter's (cost/verify.py)."""
        try:
            launch = native_launcher(path, plan, item.kernel, RUN_THREADS)
            status = launch()
            buffers = launch.keep_alive[0]  # type: ignore[attr-defined]
            if status != 0:
                return [Failure(item.kernel.describe(), f"the kernel returned {status}")]
            problem = output_mismatch(item.kernel, buffers)
            if problem is not None:
                return [Failure(item.kernel.describe(), problem)]
        except Exception as error:
            return [Failure(item.kernel.describe(), f"running failed: {error!r}")]
        return []


def check_model(path: Path, layout: str = "auto", cache_dir: Path | None = None, run: bool = False,
                say: Callable[[str], None] = lambda line: None) -> CompilingCost:  # fmt: skip
    """Plan `path` with the analytic cost model, compiling (with `run`: and running) every candidate; `say`
    hears what it is doing (a large model plans for minutes and compiles for longer)."""
    from kernorch.options import Options
    from kernorch.pipeline import import_graph, make_cost_model, plan_graph

    options = Options(cost="analytic", layout=layout, cache_dir=cache_dir)
    compiling = CompilingCost(make_cost_model(options), cache_dir, run=run)
    say("planning (the candidates are collected on the way)")
    plan_graph(import_graph(str(path)), options, cost_model=compiling)
    say(f"compiling {compiling.pending} kernels{' and running each' if run else ''}")
    compiling.compile_all()
    return compiling


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kernorch.devtools.compile_candidates",
                                     description="Compile every candidate kernel of ONNX models (no timing); "
                                                 "exit 1 when any fails to render or compile (or, with "
                                                 "--run, differs from the reference), 2 on a file that is not "
                                                 "a model.")  # fmt: skip
    parser.add_argument("models", nargs="+", type=Path, help="ONNX files")
    parser.add_argument("--layout", default="auto", choices=("auto", "nchw", "channels-last"),
                        help="layout policy of the planning run (auto: both the 0-1 assignment and channels-last)")
    parser.add_argument("--run", action="store_true",
                        help="also run each kernel once on seeded inputs against the reference interpreter")
    args = parser.parse_args(argv)
    broken = 0
    for path in args.models:
        start = time.perf_counter()

        def say(line: str, name: str = path.name) -> None:
            print(f"{name}: {line}...", flush=True)

        try:
            result = check_model(path, args.layout, run=args.run, say=say)
        except KernorchError as error:  # a file that is not a model: one line, exit 2
            print(f"{path}: {error}", file=sys.stderr)
            return 2
        broken += len(result.failures)
        print(f"{path.name}: {result.compiled} kernels compiled{' and run' if args.run else ''}, "
              f"{len(result.failures)} failed "
              f"({time.perf_counter() - start:.0f} s)", flush=True)  # fmt: skip
        for failure in result.failures:
            print(f"  {failure.kernel[:120]}: {failure.error}", flush=True)
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
