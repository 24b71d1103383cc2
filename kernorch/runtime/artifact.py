"""Saved plans: a directory of data, loaded as if it were hostile.

A plan directory holds `plan.json` (graph, kernels, costs, file hashes, the machine it was built on),
`weights.npz` (constants; loaded with allow_pickle=False) and `kernels.c` (the generated source, for
reading). No binary is shipped or ever loaded from it: at load the C source is regenerated from the plan
and must equal the shipped `kernels.c`, and the library is built from that verified source on this
machine (a hash-keyed compile cache makes that instant for a plan built here). A plan built on a CPU
with other ISA flags is therefore rebuilt for this one, never executed blindly.

A GPU plan (`device` in plan.json: v100, a100, h100) ships `kernels.py` instead: its Triton kernels, likewise
regenerated from the plan at load, compared, and only the regenerated text is imported (runtime/gpu_plan.py).

`plan.json` carries the hash of its own canonical content, so an edited or truncated manifest is caught
before anything in it is used. Every refusal is an `ArtifactError`: one line naming the file and why.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from kernorch.codegen.backends import refuse_native, refused_native
from kernorch.codegen.program import CFLAGS, compiler_identity
from kernorch.errors import KernorchError
from kernorch.ir.graph import Graph, verify
from kernorch.ir.kernel import CandidateKernel, make_kernel
from kernorch.ir.plan import validate_plan
from kernorch.ir.serialize import constants_npz, graph_from_json, graph_to_json
from kernorch.ir.types import TensorType
from kernorch.machine import cpu_model, isa_digest, isa_flags
from kernorch.options import check_threads
from kernorch.runtime.executor import generate_source
from kernorch.runtime.memory import check_fits
from kernorch.runtime.origin import ORIGIN_KEY, PlanOrigin

FORMAT = "kernorch-plan"
FORMAT_VERSION = 4  # 3: lstm_recurrence takes its recurrent weights packed; 4: kernels.c holds rTask variants
REQUIRED_FILES = ("weights.npz", "kernels.c")
GPU_FILES = ("weights.npz", "kernels.py")
MANIFEST_HASH_KEY = "manifest_sha256"


class ArtifactError(KernorchError):
    """A saved plan directory is missing, corrupted, tampered with, or from an incompatible version."""


def _digest_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def manifest_digest(plan: dict[str, Any]) -> str:
    body = {k: v for k, v in plan.items() if k != MANIFEST_HASH_KEY}
    return _digest_bytes(json.dumps(body, sort_keys=True, separators=(",", ":")).encode())


class SavablePlan(Protocol):
    """What a saved plan holds (a compiled model has it)."""

    graph: Graph
    kernels: list[CandidateKernel]
    costs: list[float]
    threads: int
    metadata: dict[str, Any]


@dataclass(frozen=True)
class SavedPlan:
    """A plan directory's content, verified: what a compiled model is built from (runtime/compiled.py)."""

    graph: Graph
    kernels: list[CandidateKernel]
    costs: list[float]
    threads: int
    metadata: dict[str, Any]
    device: str = "cpu"  # a GPU plan: its preset
    tf32: bool = False


def _gpu_source(kernels: list[CandidateKernel], device: str, tf32: bool) -> str:
    from kernorch.codegen.program import gpu_sources
    from kernorch.codegen.target import GPU_TARGETS

    return gpu_sources(kernels, GPU_TARGETS[device], tf32)[0]


def save_plan(model: SavablePlan, target: Path) -> Path:
    target.mkdir(parents=True, exist_ok=True)
    graph = model.graph
    device = str(model.metadata.get("device", "cpu"))
    tf32 = bool(model.metadata.get("tf32", False))
    (target / "weights.npz").write_bytes(constants_npz(graph))
    files = REQUIRED_FILES
    if device != "cpu":
        files = GPU_FILES
        (target / "kernels.py").write_text(_gpu_source(model.kernels, device, tf32))
    else:
        # with its rTasks whatever runtime the model ran in: what a load regenerates and compares it with
        (target / "kernels.c").write_text(generate_source(model.kernels)[0])
    for stale_name in ("kernels.so", "kernels.py" if device == "cpu" else "kernels.c"):
        stale = target / stale_name  # written by older versions or another device; never read, never left to mislead
        if stale.is_file():
            stale.unlink()
    plan: dict[str, Any] = {
        "device": device, "tf32": tf32,
        "format": FORMAT, "version": FORMAT_VERSION,
        "graph": graph_to_json(graph),
        "kernels": [{"nodes": list(k.nodes), "outputs": list(k.outputs)} for k in model.kernels],
        "costs": model.costs, "threads": model.threads, "metadata": model.metadata,
        # kernels whose native code a library refused here: run by their reference implementation
        # (codegen/backends/registry.py)
        "refused_native": {str(k): reason for k, kernel in enumerate(model.kernels)
                           if (reason := refused_native(kernel)) is not None},
        "built_on": {"cpu": cpu_model(), "isa_digest": isa_digest(), "isa_flags": list(isa_flags()),
                     "compiler": compiler_identity()[1], "cflags": list(CFLAGS)},
        "sha256": {name: _digest_bytes((target / name).read_bytes()) for name in files},
    }  # fmt: skip
    plan[MANIFEST_HASH_KEY] = manifest_digest(json.loads(json.dumps(plan)))
    (target / "plan.json").write_text(json.dumps(plan, indent=1))
    return target


def read_manifest(source: Path) -> dict[str, Any]:
    """plan.json, checked: parseable, a kernorch plan of this version, its own hash intact."""
    plan_file = source / "plan.json"
    if not source.is_dir():
        raise ArtifactError(f"{source} is not a kernorch plan directory (no such directory)")
    if not plan_file.is_file():
        raise ArtifactError(f"{source} is not a kernorch plan directory (no plan.json)")
    return read_json_manifest(plan_file, FORMAT, FORMAT_VERSION, "kernorch plan",
                              " (re-run `kernorch optimize MODEL -o DIR`)")  # fmt: skip


def read_json_manifest(path: Path, format_name: str, version: int, kind: str, remedy: str = "") -> dict[str, Any]:
    """A JSON manifest that carries its own hash (a plan's plan.json, a dynamic model's family.json), checked:
    parseable, of `format_name` and `version`, its hash intact. Every refusal is one ArtifactError line."""
    try:
        plan = json.loads(path.read_bytes())
    except (ValueError, UnicodeDecodeError, RecursionError) as error:
        raise ArtifactError(f"{path} is corrupted: {str(error).splitlines()[0][:120]}") from None
    except OSError as error:
        raise ArtifactError(f"{path} cannot be read: {error.strerror or error}") from None
    if not isinstance(plan, dict) or plan.get("format") != format_name:
        raise ArtifactError(f"{path} is not a {kind}")
    if plan.get("version") != version:
        raise ArtifactError(f"{path} has format version {plan.get('version')!r}; this kernorch reads "
                            f"version {version}{remedy}")  # fmt: skip
    if plan.get(MANIFEST_HASH_KEY) != manifest_digest(plan):
        raise ArtifactError(f"{path} was modified after it was written (its manifest hash does not match)")
    return plan


def check_origin(source: Path, plan: dict[str, Any], expected: PlanOrigin) -> None:
    """The plan (its verified manifest) was made for what `expected` names, else one ArtifactError line."""
    metadata = plan.get("metadata")
    try:
        recorded = PlanOrigin.from_json(metadata.get(ORIGIN_KEY) if isinstance(metadata, dict) else None)
    except (ValueError, TypeError, KeyError) as error:
        raise ArtifactError(f"{source} {str(error).splitlines()[0][:120]}: it cannot be checked against its "
                            "model; refusing it") from None  # fmt: skip
    problem = expected.mismatch(recorded)
    if problem is not None:
        raise ArtifactError(f"{source} holds a plan {problem}; refusing it")


def manifest_hash(directory: Path) -> str:
    """The manifest hash of a plan directory's plan.json (verified): what binds a family entry to its plan."""
    return str(read_manifest(directory)[MANIFEST_HASH_KEY])


def _verified_bytes(source: Path, plan: dict[str, Any], name: str) -> bytes:
    digests = plan.get("sha256")
    if not isinstance(digests, dict) or not isinstance(digests.get(name), str):
        raise ArtifactError(f"{source / 'plan.json'} lists no hash for {name}")
    path = source / name
    if not path.is_file():
        raise ArtifactError(f"{path} is missing")
    data = path.read_bytes()
    if _digest_bytes(data) != digests[name]:
        raise ArtifactError(f"{path} does not match its checksum (corrupted or modified)")
    return data


def read_plan(directory: str | os.PathLike[str], threads: int | None = None,
              expected: PlanOrigin | None = None) -> SavedPlan:  # fmt: skip
    """A saved plan, read without re-tuning; refuses anything corrupted, tampered with or inconsistent, and, given
    `expected`, a plan made for another model, other input shapes or other options (runtime/origin.py)."""
    if threads is not None:
        check_threads(threads)
    source = Path(directory)
    plan = read_manifest(source)
    if expected is not None:  # before a byte of weights is read: another model's plan is refused cheaply
        check_origin(source, plan, expected)
    device = plan.get("device", "cpu")
    from kernorch.codegen.target import GPU_TARGETS

    if not isinstance(device, str) or (device != "cpu" and device not in GPU_TARGETS):
        raise ArtifactError(f"{source / 'plan.json'} is for an unknown device {str(device)[:40]!r}")
    tf32 = plan.get("tf32", False) is True
    weights = _verified_bytes(source, plan, "weights.npz")
    source_name = "kernels.c" if device == "cpu" else "kernels.py"
    shipped_source = _verified_bytes(source, plan, source_name)
    plan_file = source / "plan.json"
    try:
        declared = plan["graph"]["types"]
        constants = sum(TensorType(tuple(declared[c][0]), declared[c][1]).nbytes for c in plan["graph"]["constants"])
    except Exception as error:  # noqa: BLE001 - hostile data may break any check; each is a refusal
        raise ArtifactError(f"{source / 'plan.json'} is malformed: {str(error).splitlines()[0][:160]}") from None
    check_fits({"weights": constants}, f"the plan {source}")  # before a byte of weights.npz is inflated
    try:
        graph = graph_from_json(plan["graph"], weights)
        verify(graph)
        kernels = [make_kernel(graph, tuple(int(i) for i in k["nodes"]), tuple(str(o) for o in k["outputs"]))
                   for k in plan["kernels"]]  # fmt: skip
        for kernel in kernels:
            if any(not 0 <= i < len(graph.nodes) for i in kernel.nodes) or len(set(kernel.nodes)) != len(kernel.nodes):
                raise ValueError(f"kernel nodes {kernel.nodes} are not distinct nodes of the graph")
        validate_plan(graph, kernels)
        costs = [float(c) for c in plan["costs"]]
        saved_threads = check_threads(plan.get("threads", 2))
        refused = plan.get("refused_native", {})
        if not isinstance(refused, dict) or not all(isinstance(r, str) and len(r) <= 300 for r in refused.values()):
            raise ValueError("refused_native must map kernel positions to reasons")
        for position, reason in refused.items():
            if not 0 <= int(position) < len(kernels) or not refuse_native(kernels[int(position)], reason):
                raise ValueError(f"refused_native names kernel {position}, which is not a single primitive")
        metadata = plan.get("metadata", {})
        if len(costs) != len(kernels) or not isinstance(metadata, dict):
            raise ValueError("costs or metadata do not fit the kernels")
    except Exception as error:  # noqa: BLE001 - hostile data may break any check; each is a refusal
        raise ArtifactError(f"{plan_file} is malformed: {str(error).splitlines()[0][:160]}") from None
    try:
        regenerated = generate_source(kernels)[0] if device == "cpu" else _gpu_source(kernels, device, tf32)
    except KernorchError as error:
        raise ArtifactError(f"{plan_file} is malformed: {error}") from None
    if regenerated.encode() != shipped_source:
        raise ArtifactError(f"{source / source_name} is not the code plan.json generates (edited, or from "
                            "another kernorch version); refusing to build it")  # fmt: skip
    if device != "cpu":
        return SavedPlan(graph, kernels, costs, threads or saved_threads, metadata, device, tf32)
    built_on = plan.get("built_on", {})
    if isinstance(built_on, dict) and built_on.get("isa_digest") != isa_digest():
        metadata = {**metadata, "rebuilt_for_this_cpu": True}
    return SavedPlan(graph, kernels, costs, threads or saved_threads, metadata)
