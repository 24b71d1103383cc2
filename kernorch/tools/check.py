"""`kernorch check`: fission a model, run it with the reference interpreter, compare with onnxruntime."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from kernorch.errors import KernorchError
from kernorch.fission import fission
from kernorch.frontend import ImportedModel, import_model
from kernorch.ir.graph import Graph
from kernorch.ir.types import TensorType
from kernorch.rewrite import rewrite as rewrite_graph
from kernorch.rewrite.search import DEFAULT_BUDGET_SECONDS
from kernorch.runtime import run_reference

DEFAULT_RTOL = 1e-4


def index_ranges(model: ImportedModel) -> dict[str, int]:
    """Upper bound for integer inputs used as Gather indices (token ids): the gathered axis' size."""
    sizes = {name: array.shape for name, array in model.constants.items()}
    bounds: dict[str, int] = {}
    for node in model.graph.node:
        if node.op_type == "Gather" and len(node.input) > 1 and node.input[1] in model.input_types:
            data_shape = sizes.get(node.input[0])
            if data_shape is not None:
                axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
                bound = data_shape[axis]
                bounds[node.input[1]] = min(bounds.get(node.input[1], bound), bound)
    return bounds


def seeded_feeds(input_types: Mapping[str, TensorType], index_bounds: Mapping[str, int],
                 seed: int = 0) -> dict[str, np.ndarray]:  # fmt: skip
    """Normal floats, integers drawn in [0, bound) (token ids inside the table they index), random bools."""
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for name, value_type in input_types.items():
        if value_type.is_float:
            feeds[name] = rng.standard_normal(value_type.shape).astype(value_type.dtype)
        elif value_type.dtype == "bool":
            feeds[name] = rng.random(value_type.shape) < 0.5
        else:
            feeds[name] = rng.integers(0, index_bounds.get(name, 10), value_type.shape).astype(value_type.dtype)
    return feeds


def random_inputs(model: ImportedModel, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded inputs for an imported ONNX model."""
    return seeded_feeds(model.input_types, index_ranges(model), seed)


def onnxruntime_session(proto: onnx.ModelProto, threads: int = 2) -> Any:
    try:
        import onnxruntime as ort
    except ImportError:
        raise KernorchError("onnxruntime is needed to check results: pip install 'kernorch[ort]'") from None

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])


def run_onnxruntime(proto: onnx.ModelProto, feeds: dict[str, np.ndarray], threads: int = 2) -> dict[str, np.ndarray]:
    session = onnxruntime_session(proto, threads)
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds), strict=True))


def timed_onnxruntime(proto: onnx.ModelProto, feeds: dict[str, np.ndarray], threads: int, runs: int) -> float:
    """Median milliseconds of onnxruntime (all graph optimizations) on `feeds`."""
    session = onnxruntime_session(proto, threads)
    session.run(None, feeds)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        session.run(None, feeds)
        times.append(time.perf_counter() - start)
    return float(np.median(times) * 1e3)


def random_feeds_for(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded inputs for a primitive graph (a saved plan has no ONNX model to look at)."""
    bounds: dict[str, int] = {}
    for node in graph.nodes:
        if node.prim == "gather" and node.inputs[1] in graph.inputs:
            size = graph.types[node.inputs[0]].shape[node.attr("axis")]
            bounds[node.inputs[1]] = min(bounds.get(node.inputs[1], size), size)
    return seeded_feeds({name: graph.types[name] for name in graph.inputs}, bounds, seed)


@dataclass
class OutputError:
    name: str
    max_abs: float
    relative: float  # max abs error / max |reference|


@dataclass
class CheckReport:
    model: str
    primitive_counts: dict[str, int]
    primitives: int
    errors: list[OutputError] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    rtol: float = DEFAULT_RTOL

    @property
    def worst_relative(self) -> float:
        return max((e.relative for e in self.errors), default=0.0)

    @property
    def passed(self) -> bool:
        return self.worst_relative <= self.rtol

    def lines(self) -> list[str]:
        kinds = ", ".join(f"{kind} {count}" for kind, count in sorted(self.primitive_counts.items()))
        out = [f"{self.model}: {self.primitives} primitives ({kinds})"]
        for e in self.errors:
            out.append(f"  output {e.name}: max abs err {e.max_abs:.3e}, rel err {e.relative:.3e}")
        timing = ", ".join(f"{k} {v:.2f}s" for k, v in self.seconds.items())
        verdict = "PASS" if self.passed else "FAIL"
        out.append(f"  {verdict} (rel err {self.worst_relative:.3e} vs tolerance {self.rtol:.0e}; {timing})")
        return out


def compare(actual: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> list[OutputError]:
    errors = []
    for name, reference in expected.items():
        got = actual[name]
        if got.shape != reference.shape:
            errors.append(OutputError(name, float("inf"), float("inf")))
            continue
        if reference.dtype == bool or reference.dtype.kind in "iu":
            mismatches = float(np.count_nonzero(got != reference))
            errors.append(OutputError(name, mismatches, mismatches))
            continue
        diff = np.abs(got.astype(np.float64) - reference.astype(np.float64))
        both_nan = np.isnan(got) & np.isnan(reference)
        diff = np.where(both_nan, 0.0, diff)
        max_abs = float(np.nanmax(diff, initial=0.0)) if not np.isnan(diff).any() else float("inf")
        scale = float(np.max(np.abs(reference[np.isfinite(reference)]), initial=0.0))
        errors.append(OutputError(name, max_abs, max_abs / scale if scale > 0 else max_abs))
    return errors


def check_model(
    source: str | os.PathLike[str] | onnx.ModelProto,
    input_shapes: dict[str, tuple[int, ...]] | None = None,
    seed: int = 0,
    rtol: float = DEFAULT_RTOL,
    compiled: bool = False,
    cost: str = "profile",
    rewrite: bool = True,
    rewrite_budget: float = DEFAULT_BUDGET_SECONDS,
) -> tuple[CheckReport, Graph]:
    """Compare kernorch with onnxruntime on seeded inputs: the reference interpreter on the fissioned
    graph (with the cost-independent rewrites unless rewrite=False), or with `compiled=True` the
    optimized plan as generated code."""
    started = time.perf_counter()
    model = import_model(source, input_shapes)
    graph = fission(model)
    if rewrite and not compiled:
        graph, _ = rewrite_graph(graph)
    fissioned = time.perf_counter()
    feeds = random_inputs(model, seed)
    if compiled:
        from kernorch.api import compile_plan, plan_model

        program = compile_plan(plan_model(model.proto, input_shapes, cost=cost, rewrite=rewrite,
                                          rewrite_budget=rewrite_budget))  # fmt: skip
        graph = program.graph
        fissioned = time.perf_counter()
        actual = program.run(feeds)
    else:
        actual = run_reference(graph, feeds)
    interpreted = time.perf_counter()
    expected = run_onnxruntime(model.proto, feeds)
    finished = time.perf_counter()
    name = os.path.basename(str(source)) if not isinstance(source, onnx.ModelProto) else graph.name
    report = CheckReport(
        model=name,
        primitive_counts=graph.count_by_kind(),
        primitives=len(graph.nodes),
        errors=compare(actual, expected),
        seconds={("optimize+compile" if compiled else "import+fission+rewrite" if rewrite else "import+fission"):
                 fissioned - started,
                 ("compiled run" if compiled else "reference"): interpreted - fissioned,
                 "onnxruntime": finished - interpreted},  # fmt: skip
        rtol=rtol,
    )
    return report, graph
