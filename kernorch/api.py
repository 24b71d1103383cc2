"""Public API: `kernorch.compile(model) -> CompiledModel`, `CompiledModel.save(dir)`, `kernorch.load(dir)`.

`compile` takes the options of `kernorch.options.Options`, as an object or as keywords
(`kernorch.compile("m.onnx", threads=1, cost="analytic")`). A saved plan is data plus C source; see
`kernorch.runtime.artifact` for how loading treats it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kernorch.errors import KernorchError
from kernorch.frontend import bind, checked_proto, input_signature, is_dynamic
from kernorch.frontend.onnx_import import load_proto
from kernorch.frontend.torch_export import export_to_onnx, is_torch_module
from kernorch.options import Options
from kernorch.pipeline import ModelSource, Progress, compile_model
from kernorch.runtime.artifact import ArtifactError
from kernorch.runtime.compiled import CompiledModel, load_model
from kernorch.runtime.gpu_plan import GpuModel
from kernorch.runtime.origin import PlanOrigin, model_digest
from kernorch.shapes import DynamicModel, is_family, load_dynamic

__all__ = ["ArtifactError", "CompiledModel", "DynamicModel", "GpuModel", "compile", "load"]


def compile(  # noqa: A001 - the public name the docs promise
    model: ModelSource,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    options: Options | None = None,
    progress: Progress | None = None,
    example_inputs: Sequence[Any] | None = None,
    **option_overrides: Any,
) -> CompiledModel | DynamicModel | GpuModel:
    """Import, fission, rewrite, orchestrate and compile an ONNX model — or a torch `nn.Module`, given
    `example_inputs` (a tuple of tensors: the export is specialised to their shapes), through torch.export.

    Options (see `kernorch.options.Options`): threads=2; cost="profile" (time candidate kernels on this
    machine, cached in SQLite) or "analytic" (roofline of `device`: "cpu" = this machine calibrated, or a
    preset); limits=OrchestrationLimits(); rewrite=True; rewrite_budget=60 (seconds of cost-guided rewrite
    search); screen=True (profiling skips fusions the GIR performance model predicts more than 2x slower than
    their primitives apart); cache_dir=None ($KERNORCH_CACHE or ~/.cache/kernorch); max_workspaces=None (at
    most that many calls of one plan run at once; the others wait). The plan records the model, input shapes and
    these options it was made for (`kernorch.load(dir, model=...)` checks them).

    device="v100"/"a100"/"h100" (analytic cost) or "cuda" (the GPU present) plans for a GPU and returns a
    `GpuModel` (runtime/gpu_plan.py): Triton kernels and cuBLAS/cuDNN through torch, replayed as a CUDA graph; tf32=True
    lets its matmuls use TF32; interpret=True runs it in Triton's interpreter on a machine without a GPU.

    A model with symbolic dims that `input_shapes` does not bind compiles to a `DynamicModel` (kernorch/shapes/):
    a plan per concrete shape, those of shapes=[{...}, ...] and buckets={"batch": (1, 2, 4, 8)} prepared now;
    any other is served at once by onnxruntime and planned in the background once it is called again and again
    (new_shapes="specialise" plans it on first use, on the caller's thread; "refuse" refuses it; pad=("batch",)
    pads up to a bucket where that is proven exact; background_tuning=True, with "specialise", serves an
    analytic plan while the measured one is tuned). ranges=["sequence=1,past=1..256"] plans each range once, a
    shape-generic plan whose kernels take the sizes at run time: any shape inside it runs at once
    (kernorch/shapes/generic.py).
    """
    chosen = (options or Options()).with_(**option_overrides)
    if is_torch_module(model):
        if example_inputs is None:
            raise KernorchError("compiling a torch module needs example_inputs=(tensor, ...), its positional inputs")
        model = export_to_onnx(model, example_inputs)
    elif example_inputs is not None:
        raise KernorchError("example_inputs is for torch modules; an ONNX model's input shapes come from the model "
                            "or from input_shapes")  # fmt: skip
    if input_shapes is None:
        model = load_proto(model)
        try:
            signature = input_signature(model)
        except KernorchError:  # a model the import refuses anyway: its own message, from the usual path
            signature = []
        if is_dynamic(signature):
            if chosen.gpu:
                raise KernorchError("GPU plans take static shapes: give input_shapes for the symbolic dims")
            checked_proto(model)  # a malformed model is refused now, not at its first call
            return DynamicModel(model.SerializeToString(), chosen, progress or Progress()).prepare()
        if len(chosen.shapes) > 1 or chosen.buckets:
            raise KernorchError("the model has static shapes: shapes/buckets are for models with symbolic dims")
        if chosen.shapes:
            bind(signature, dict(chosen.shapes[0]))  # refuses a shape set that contradicts the model
    return compile_model(model, input_shapes, chosen.with_(shapes=(), pad=()), progress or Progress())


def load(directory: str | os.PathLike[str], threads: int | None = None,
         cache_dir: str | os.PathLike[str] | None = None, runtime: str = "kernels",
         model: ModelSource | None = None,
         max_workspaces: int | None = None) -> CompiledModel | DynamicModel | GpuModel:  # fmt: skip
    """Load a saved plan without re-tuning; refuses a corrupted, tampered or mismatched artifact. `runtime`:
    "kernels" (kernel by kernel) or "rprogram" (scheduled rTasks, calibrated in place when loaded). A directory
    a `DynamicModel` saved loads as one, every specialisation verified against its model, shapes and options; a
    GPU plan as a `GpuModel`. `model` (an ONNX path, bytes or proto): the plan must have been made from it, else
    it is refused (runtime/origin.py). `max_workspaces`: at most that many concurrent calls run at once on a
    plan; the others wait (None: as many as call at once, while memory lasts)."""
    cache = Path(cache_dir) if cache_dir is not None else None
    expected = PlanOrigin(model_digest(model)) if model is not None else None
    if is_family(directory):
        return load_dynamic(directory, threads, cache, runtime, max_workspaces,
                            expected.model_sha256 if expected is not None else None)  # fmt: skip
    return load_model(directory, threads, cache, runtime, expected=expected, max_workspaces=max_workspaces)
