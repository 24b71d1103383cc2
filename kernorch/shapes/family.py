"""A model's family of plans on disk: `DynamicModel.save` writes (`write_family`) every specialisation (a plan
directory each, its manifest hash listed), the model itself (new shapes after `kernorch.load`), the options, each
range's kernels and which specialised shapes run their range's generic plan, in family.json; `load_dynamic` reads
them (`read_family`), verified — the model against its checksum, each plan against the model, the shape set it is
filed under and the family's options — and regenerates each range's code from the model (shapes/generic.py)."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernorch.frontend import InputSignature, ShapeSet, shape_set
from kernorch.options import Options, options_from_json, options_to_json, plan_shaping
from kernorch.runtime.artifact import (
    MANIFEST_HASH_KEY,
    ArtifactError,
    manifest_digest,
    manifest_hash,
    read_json_manifest,
)
from kernorch.runtime.compiled import CompiledModel, load_model
from kernorch.runtime.origin import PlanOrigin
from kernorch.shapes.generic import SavedKernels, saved_kernels_from_json

FAMILY_FORMAT = "kernorch-dynamic-plan"
FAMILY_VERSION = 2  # 2: each specialisation's manifest hash, each plan's origin checked
FAMILY_FILE = "family.json"
MODEL_FILE = "model.onnx"


def write_family(directory: str | os.PathLike[str], model: bytes, signature: Sequence[InputSignature],
                 options: Options, specialisations: Mapping[ShapeSet, CompiledModel],
                 ranges: Sequence[tuple[str, SavedKernels]], generic_first: Sequence[ShapeSet]) -> Path:  # fmt: skip
    """The family under `directory` (module doc): `ranges` each range's description and kernels, `generic_first`
    the specialised shape sets its range's generic plan runs."""
    target = Path(directory)
    target.mkdir(parents=True, exist_ok=True)
    (target / MODEL_FILE).write_bytes(model)
    entries = []
    for index, (shapes, plan) in enumerate(specialisations.items()):
        folder = f"shape-{index}"
        plan.save(target / folder)
        entries.append({"shapes": [[name, list(shape)] for name, shape in shapes], "dir": folder,
                        "manifest_sha256": manifest_hash(target / folder)})  # fmt: skip
    family: dict[str, Any] = {
        "format": FAMILY_FORMAT, "version": FAMILY_VERSION,
        "inputs": [{"name": s.name, "dims": list(s.dims), "dtype": s.dtype} for s in signature],
        "options": options_to_json(options),
        "model_sha256": hashlib.sha256(model).hexdigest(),
        "specialisations": entries,
        # each range's kernels (its code is regenerated from the model and checked when it is loaded)
        "generic_plans": [{"range": spec, "kernels": [[list(n), list(o)] for n, o in kernels]}
                          for spec, kernels in ranges],
        # the specialised shape sets whose range's generic plan measured faster (it runs them)
        "generic_first": [[[name, list(shape)] for name, shape in shapes] for shapes in generic_first
                          if shapes in specialisations],
    }  # fmt: skip
    family[MANIFEST_HASH_KEY] = manifest_digest(json.loads(json.dumps(family)))
    (target / FAMILY_FILE).write_text(json.dumps(family, indent=1))
    return target


@dataclass(frozen=True)
class Family:
    """A family as read and verified (`read_family`)."""

    model: bytes
    options: Options
    plans: dict[ShapeSet, CompiledModel]
    inputs: list[Any]  # the inputs family.json declares (the model's, or it is refused)
    ranges: dict[str, SavedKernels]  # each range's kernels
    generic_first: list[ShapeSet]
    manifest: Path


def _load_family_plan(folder: Path, shapes: ShapeSet, family: dict[str, Any], threads: int | None,
                      cache_dir: Path | None, runtime: str, max_workspaces: int | None) -> Any:  # fmt: skip
    """One of a family's plans, checked against what the family files it under: its model, its shape set and its
    options (an analytic plan where the family tuned in the background: the one served first, saved if the
    measured one was not ready)."""
    options = plan_shaping(options_from_json(family["options"], cache_dir))
    expected = PlanOrigin(str(family["model_sha256"]), shapes, options)
    try:
        return load_model(folder, threads, cache_dir, runtime, expected=expected, max_workspaces=max_workspaces)
    except ArtifactError as refusal:
        if not family["options"].get("background_tuning") or "planned with other options" not in str(refusal):
            raise
    quick = PlanOrigin(expected.model_sha256, shapes, {**options, "cost": "analytic"})
    return load_model(folder, threads, cache_dir, runtime, expected=quick, max_workspaces=max_workspaces)


def is_family(directory: str | os.PathLike[str]) -> bool:
    return (Path(directory) / FAMILY_FILE).is_file()


def read_family(directory: str | os.PathLike[str], threads: int | None = None, cache_dir: Path | None = None,
                runtime: str = "kernels", max_workspaces: int | None = None,
                model_sha256: str | None = None) -> Family:  # fmt: skip
    """A saved family: the manifest's own hash, the model's hash and each specialisation (verified as a saved plan
    whose origin is the model, shape set and options it is filed under) checked before any is used.
    `model_sha256`: the model the family must hold, checked before any plan is read (or compiled)."""
    source = Path(directory)
    manifest = source / FAMILY_FILE
    family = read_json_manifest(manifest, FAMILY_FORMAT, FAMILY_VERSION, "kernorch dynamic-shape plan")
    try:
        model = (source / MODEL_FILE).read_bytes()
    except OSError as error:
        raise ArtifactError(f"{source / MODEL_FILE} cannot be read: {error.strerror or error}") from None
    if hashlib.sha256(model).hexdigest() != family.get("model_sha256"):
        raise ArtifactError(f"{source / MODEL_FILE} does not match its checksum (corrupted or modified)")
    if model_sha256 is not None and model_sha256 != family["model_sha256"]:
        raise ArtifactError(f"{source} holds the plans of another model (sha256 {family['model_sha256'][:12]}…, "
                            f"not {model_sha256[:12]}…); refusing it")  # fmt: skip
    try:
        options = options_from_json(family["options"], cache_dir)
        if threads is not None:
            options = options.with_(threads=threads)
        options = options.with_(runtime=runtime, max_workspaces=max_workspaces)
        plans: dict[ShapeSet, CompiledModel] = {}
        for entry in family["specialisations"]:
            shapes = shape_set({str(name): tuple(int(d) for d in shape) for name, shape in entry["shapes"]})
            folder = str(entry["dir"])
            if "/" in folder or "\\" in folder or folder.startswith("."):
                raise ValueError(f"specialisation folder '{folder[:40]}' is not a plain name")
            if manifest_hash(source / folder) != entry["manifest_sha256"]:
                raise ArtifactError(f"{source / folder} is not the plan {FAMILY_FILE} lists there (its manifest hash "
                                    "differs: replaced or edited)")  # fmt: skip
            # its origin (model, input shapes, options) is the one it is filed under, or it is refused
            plans[shapes] = _load_family_plan(source / folder, shapes, family, threads, cache_dir, runtime,
                                              max_workspaces)  # fmt: skip
        ranges = {str(entry["range"]): saved_kernels_from_json(entry["kernels"])
                  for entry in family.get("generic_plans", [])}  # fmt: skip
        first = [shape_set({str(name): tuple(int(d) for d in shape) for name, shape in entry})
                 for entry in family.get("generic_first", [])]  # fmt: skip
    except ArtifactError:
        raise
    except Exception as error:  # noqa: BLE001 - hostile data may break any check; each is a refusal
        raise ArtifactError(f"{manifest} is malformed: {str(error).splitlines()[0][:160]}") from None
    return Family(model, options, plans, list(family.get("inputs") or []), ranges, first, manifest)
