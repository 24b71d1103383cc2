"""Verify GPU plans kernel by kernel on a machine without a GPU: `python -m kernorch.tools.gpu_verify MODEL...`.

Each model is planned for a GPU (`--device`, analytic cost), its plan graph is run once by the reference
interpreter (every intermediate value kept), and every kernel of the plan runs alone — its Triton launches in
Triton's interpreter, its library call through torch on the CPU — on the reference's values of its inputs; each
output is compared with the reference's. Kernels with the same code (the same signature: one rendered kernel at
one shape) run once. `--reduced` plans a model at smaller input shapes where its dims are symbolic; the shared
models are static, so it is their full size. Exit 1 when any kernel differs.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kernorch.codegen.backends import choose_backend
from kernorch.codegen.target import GPU_TARGETS
from kernorch.cost.profile import isolate
from kernorch.ir.graph import Graph
from kernorch.ir.primitives import run_primitive
from kernorch.options import Options
from kernorch.runtime.feeds import graph_feeds
from kernorch.runtime.reference import check_feeds

TOLERANCE = 1e-4  # relative to the output's largest magnitude, as `kernorch check`


@dataclass
class Verification:
    model: str
    kernels: int = 0
    distinct: int = 0
    by_backend: Counter[str] = field(default_factory=Counter)
    prims: set[str] = field(default_factory=set)
    worst: float = 0.0
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def line(self) -> str:
        backends = ", ".join(f"{name} {count}" for name, count in sorted(self.by_backend.items()))
        verdict = "ok" if not self.failures else f"{len(self.failures)} FAILED"
        return (f"{self.model}: {self.kernels} kernels, {self.distinct} distinct run ({backends}); worst rel err "
                f"{self.worst:.1e}; {verdict}; {self.seconds:.0f} s")


def all_values(graph: Graph, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    values: dict[str, np.ndarray] = dict(graph.constants)
    values.update(check_feeds(graph, feeds))
    for node in graph.nodes:
        values.update(zip(node.outputs, run_primitive(node.prim, [values[v] for v in node.inputs], node.attr_dict),
                          strict=True))  # fmt: skip
    return values


def verify_model(path: str, device: str = "a100", rewrite: bool = True) -> Verification:
    from kernorch.cost.profile import signature
    from kernorch.pipeline import plan_model
    from kernorch.runtime.gpu_plan import GpuProgram

    started = time.perf_counter()
    options = Options(cost="analytic", device=device, rewrite=rewrite, rewrite_budget=10.0, interpret=True)
    plan = plan_model(path, options=options).plan
    graph = plan.graph
    values = all_values(graph, graph_feeds(graph, seed=0))
    report = Verification(Path(path).stem, len(plan.kernels))
    seen: set[str] = set()
    for k, kernel in enumerate(plan.kernels):
        backend, _ = choose_backend(kernel, "gpu")
        assert backend is not None
        report.prims.update(n.prim for n in kernel.primitives)
        if not backend.runs_code:
            report.by_backend[backend.name] += 1
            continue
        key = signature(kernel, backend)[1]
        if key in seen:
            continue
        seen.add(key)
        report.distinct += 1
        report.by_backend[backend.name] += 1
        alone = isolate(kernel)
        prims = " → ".join(n.prim for n in kernel.primitives)
        try:
            program = GpuProgram(alone.graph, [alone], GPU_TARGETS[device], interpret=True, streams=1)
            got = program({v: values[v] for v in alone.graph.inputs})
        except Exception as failure:  # noqa: BLE001 - a kernel that fails is a finding, the others still run
            report.failures.append(f"kernel {k} [{prims}] by {backend.name}: {type(failure).__name__}: "
                                   f"{str(failure).splitlines()[0][:200] if str(failure) else ''}")  # fmt: skip
            continue
        for name in kernel.outputs:
            expected = values[name]
            scale = float(np.max(np.abs(expected))) if expected.size and expected.dtype.kind == "f" else 1.0
            if expected.dtype.kind == "f":
                finite = np.isfinite(expected)
                same_nan = np.array_equal(np.isnan(got[name]), np.isnan(expected))
                error = float(np.max(np.abs(got[name][finite] - expected[finite]), initial=0.0)) / max(scale, 1e-30)
            else:
                same_nan = True
                error = float(np.any(got[name] != expected))
            report.worst = max(report.worst, error)
            if error > TOLERANCE or not same_nan:
                report.failures.append(f"kernel {k} [{prims}] by {backend.name}: {name} rel err {error:.2e}")
    report.seconds = time.perf_counter() - started
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kernorch.tools.gpu_verify", description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", help="ONNX models")
    parser.add_argument("--device", default="a100", choices=sorted(GPU_TARGETS))
    parser.add_argument("--no-rewrite", dest="rewrite", action="store_false")
    args = parser.parse_args(argv)
    reports = []
    for path in args.models:
        report = verify_model(path, args.device, args.rewrite)
        print(report.line(), flush=True)
        for failure in report.failures:
            print(f"  {failure}")
        reports.append(report)
    total = sum(r.distinct for r in reports)
    print(f"{len(reports)} models: {sum(r.kernels for r in reports)} kernels, {total} distinct run in Triton's "
          f"interpreter or through torch, {sum(len(r.failures) for r in reports)} failed; primitive kinds in the "
          f"plans: {', '.join(sorted(set().union(*(r.prims for r in reports))))}")  # fmt: skip
    return 1 if any(r.failures for r in reports) else 0


if __name__ == "__main__":
    sys.exit(main())
