"""Public API: `kernorch.compile(model) -> CompiledModel`, `CompiledModel.save(dir)`, `kernorch.load(dir)`.

A saved model is data only: `plan.json` (graph, kernels, costs, checksums), `weights.npz` (constants,
loaded with allow_pickle=False), `kernels.c` and `kernels.so`. Any checksum mismatch is refused.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from kernorch.codegen.backends import GeneratableCost
from kernorch.codegen.compiler import CFLAGS, compile_source, compiler_identity
from kernorch.cost.analytic import AnalyticCostModel, device_by_name
from kernorch.cost.model import CostModel
from kernorch.errors import InputMismatch, KernorchError
from kernorch.fission import fission
from kernorch.frontend import import_model
from kernorch.ir.graph import Graph, Node, freeze_attrs, verify
from kernorch.ir.types import TensorType
from kernorch.orchestrate import OrchestrationLimits, OrchestrationResult, Plan, orchestrate, validate_plan
from kernorch.orchestrate.kernel import CandidateKernel, make_kernel
from kernorch.rewrite import rewrite as rewrite_graph
from kernorch.rewrite.search import DEFAULT_BUDGET_SECONDS
from kernorch.runtime.executor import PlanExecutor

FORMAT = "kernorch-plan"
FORMAT_VERSION = 1
DEFAULT_REWRITE_BUDGET = DEFAULT_BUDGET_SECONDS  # seconds of cost-guided rewrite search per model


class ArtifactError(KernorchError):
    """A saved plan directory is missing, corrupted, or from an incompatible version."""


@dataclass
class CompiledModel:
    graph: Graph
    kernels: list[CandidateKernel]
    costs: list[float]
    threads: int = 2
    metadata: dict[str, Any] = field(default_factory=dict)
    _library: Path | None = None

    def __post_init__(self) -> None:
        self.executor = PlanExecutor(self.graph, self.kernels, self.threads, self._library)

    @property
    def input_names(self) -> list[str]:
        return list(self.graph.inputs)

    @property
    def output_names(self) -> list[str]:
        return list(self.graph.outputs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Inputs positionally (graph order) or by name, as numpy arrays or torch tensors.
        Returns one array (or tensor, matching the inputs) per output: a single value or a tuple."""
        if len(args) > len(self.input_names):
            raise InputMismatch(f"{len(args)} inputs given, the model takes {len(self.input_names)}")
        feeds = dict(zip(self.input_names, args, strict=False))
        feeds.update(kwargs)
        as_torch = any(type(v).__module__.startswith("torch") for v in feeds.values())
        arrays = {name: (value.detach().cpu().numpy() if hasattr(value, "detach") else np.asarray(value))
                  for name, value in feeds.items()}  # fmt: skip
        outputs = self.executor(arrays)
        results: list[Any] = [outputs[name] for name in self.output_names]
        if as_torch:
            import torch

            results = [torch.from_numpy(r) for r in results]
        return results[0] if len(results) == 1 else tuple(results)

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.executor(feeds)

    # ------------------------------------------------------------------------------------ artifacts
    def save(self, directory: str | os.PathLike[str]) -> Path:
        target = Path(directory)
        target.mkdir(parents=True, exist_ok=True)
        constant_names = sorted(self.graph.constants)
        arrays: dict[str, Any] = {f"c{i}": self.graph.constants[n] for i, n in enumerate(constant_names)}
        np.savez(target / "weights.npz", **arrays)
        (target / "kernels.c").write_text(self.executor.source)
        if self.executor.library_path is not None:
            shutil.copyfile(self.executor.library_path, target / "kernels.so")
        plan = {
            "format": FORMAT, "version": FORMAT_VERSION,
            "graph": {
                "name": self.graph.name, "inputs": self.graph.inputs, "outputs": self.graph.outputs,
                "types": {n: [list(t.shape), t.dtype] for n, t in self.graph.types.items()},
                "constants": constant_names,
                "nodes": [{"prim": n.prim, "inputs": list(n.inputs), "outputs": list(n.outputs),
                           "attrs": dict(n.attrs), "origin": n.origin} for n in self.graph.nodes],
            },
            "kernels": [{"nodes": list(k.nodes), "outputs": list(k.outputs)} for k in self.kernels],
            "costs": self.costs, "threads": self.threads, "metadata": self.metadata,
            "compiler": {"flags": list(CFLAGS), "version": compiler_identity()[1]},
            "sha256": {name: _digest(target / name) for name in ("weights.npz", "kernels.c", "kernels.so")
                       if (target / name).is_file()},
        }  # fmt: skip
        (target / "plan.json").write_text(json.dumps(plan, indent=1))
        return target


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def load(directory: str | os.PathLike[str], threads: int | None = None) -> CompiledModel:
    """Load a saved plan without re-tuning; refuses a corrupted or mismatched artifact."""
    source = Path(directory)
    plan_file = source / "plan.json"
    if not plan_file.is_file():
        raise ArtifactError(f"{source} is not a kernorch plan directory (no plan.json)")
    try:
        plan = json.loads(plan_file.read_text())
    except (ValueError, UnicodeDecodeError) as error:
        raise ArtifactError(f"{plan_file} is corrupted: {error}") from None
    if not isinstance(plan, dict) or plan.get("format") != FORMAT:
        raise ArtifactError(f"{plan_file} is not a kernorch plan")
    if plan.get("version") != FORMAT_VERSION:
        raise ArtifactError(f"{plan_file} has format version {plan.get('version')}; "
                            f"this kernorch reads version {FORMAT_VERSION}")  # fmt: skip
    for name, digest in plan.get("sha256", {}).items():
        path = source / name
        if not path.is_file():
            raise ArtifactError(f"{source}: {name} is missing")
        if _digest(path) != digest:
            raise ArtifactError(f"{source}: {name} does not match its checksum (corrupted or modified)")
    try:
        graph = _graph_from_json(plan["graph"], source / "weights.npz")
        verify(graph)
        kernels = [make_kernel(graph, tuple(k["nodes"]), tuple(k["outputs"])) for k in plan["kernels"]]
        validate_plan(graph, kernels)
        costs = [float(c) for c in plan["costs"]]
    except (KeyError, TypeError, ValueError, IndexError, AssertionError) as error:
        raise ArtifactError(f"{plan_file} is malformed: {error}") from None
    library = source / "kernels.so" if (source / "kernels.so").is_file() else None
    if library is not None and plan.get("compiler", {}).get("version") != compiler_identity()[1]:
        library = compile_source((source / "kernels.c").read_text())  # same source, this machine's compiler
    try:
        return CompiledModel(graph, kernels, costs, threads or int(plan.get("threads", 2)), plan.get("metadata", {}),
                             library)  # fmt: skip
    except OSError:
        # e.g. the library was built for another CPU (-march=native): rebuild from the verified source
        rebuilt = compile_source((source / "kernels.c").read_text())
        return CompiledModel(graph, kernels, costs, threads or int(plan.get("threads", 2)), plan.get("metadata", {}),
                             rebuilt)  # fmt: skip


def _graph_from_json(data: dict[str, Any], weights: Path) -> Graph:
    with np.load(weights, allow_pickle=False) as archive:
        constants = {name: archive[f"c{i}"] for i, name in enumerate(data["constants"])}
    graph = Graph(name=data["name"], inputs=list(data["inputs"]), outputs=list(data["outputs"]))
    graph.types = {n: TensorType(tuple(int(d) for d in shape), dtype) for n, (shape, dtype) in data["types"].items()}
    graph.constants = constants
    graph.nodes = [Node(n["prim"], tuple(n["inputs"]), tuple(n["outputs"]), freeze_attrs(n["attrs"]), n["origin"])
                   for n in data["nodes"]]  # fmt: skip
    return graph


def compile(  # noqa: A001 - the public name the docs promise
    model: str | os.PathLike[str] | bytes | onnx.ModelProto,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    cost: str = "profile",
    device: str = "cpu",
    threads: int = 2,
    limits: OrchestrationLimits | None = None,
    rewrite: bool = True,
    rewrite_budget: float = DEFAULT_REWRITE_BUDGET,
) -> CompiledModel:
    """Import, fission, rewrite, orchestrate and compile an ONNX model.

    cost="profile" (default) times candidate kernels on this machine (cached in SQLite);
    cost="analytic" uses the roofline model of `device` ("cpu" = this machine calibrated, or a preset).
    rewrite=False skips the primitive-graph rewrites; `rewrite_budget` bounds (in seconds) the
    cost-guided part of them.
    """
    result = plan_model(model, input_shapes, device, limits, cost=cost, threads=threads, rewrite=rewrite,
                        rewrite_budget=rewrite_budget)  # fmt: skip
    return compile_plan(result, threads)


def plan_model(
    model: str | os.PathLike[str] | bytes | onnx.ModelProto,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    device: str = "cpu",
    limits: OrchestrationLimits | None = None,
    progress: Any = None,
    cost: str = "analytic",
    threads: int = 2,
    tuning_progress: Any = None,
    rewrite: bool = True,
    rewrite_budget: float = DEFAULT_REWRITE_BUDGET,
    rewrite_progress: Any = None,
) -> OrchestrationResult:
    """Import, fission, rewrite and orchestrate; only kernels some backend can generate are candidates."""
    shapes = {name: tuple(shape) for name, shape in (input_shapes or {}).items()}
    graph = fission(import_model(model, shapes))
    cost_model = make_cost_model(cost, device, threads, tuning_progress)
    report = None
    if rewrite:
        local_limits = limits or OrchestrationLimits()

        def plan_cost(window: Graph) -> float:
            return orchestrate(window, cost_model, local_limits).plan.cost

        graph, report = rewrite_graph(graph, plan_cost, rewrite_budget, rewrite_progress)
    result = orchestrate(graph, cost_model, limits, progress)
    result.rewrite_report = report
    return result


def make_cost_model(cost: str, device: str = "cpu", threads: int = 2, tuning_progress: Any = None) -> CostModel:
    if cost == "analytic":
        return GeneratableCost(AnalyticCostModel(device_by_name(device)))
    if cost == "profile":
        if device != "cpu":
            raise KernorchError(f"--cost profile measures this machine; --device {device} needs --cost analytic")
        from kernorch.cost.profile import ProfileDatabase, ProfiledCostModel, default_database_path

        return ProfiledCostModel(ProfileDatabase(default_database_path()), threads, tuning_progress)
    raise KernorchError(f"unknown cost model '{cost}' (choose profile or analytic)")


def compile_plan(result: OrchestrationResult, threads: int = 2, plan: Plan | None = None) -> CompiledModel:
    """Compile the result's optimal plan, or another plan of the same graph (e.g. greedy, for comparison)."""
    chosen = plan or result.plan
    metadata = {"cost_model": result.cost_model, "plan_cost": chosen.cost,
                "greedy_cost": result.greedy_plan.cost, "all_optimal": result.all_optimal,
                "rewrites": result.rewrite_report.fired_counts() if result.rewrite_report else None}  # fmt: skip
    return CompiledModel(chosen.graph, chosen.kernels, chosen.costs, threads, metadata)
