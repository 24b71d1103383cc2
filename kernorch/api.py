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
from kernorch.frontend.torch_export import export_to_onnx, is_torch_module
from kernorch.options import Options
from kernorch.pipeline import ModelSource, Progress, compile_model
from kernorch.runtime.artifact import ArtifactError
from kernorch.runtime.compiled import CompiledModel, load_model

__all__ = ["ArtifactError", "CompiledModel", "compile", "load"]


def compile(  # noqa: A001 - the public name the docs promise
    model: ModelSource,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    options: Options | None = None,
    progress: Progress | None = None,
    example_inputs: Sequence[Any] | None = None,
    **option_overrides: Any,
) -> CompiledModel:
    """Import, fission, rewrite, orchestrate and compile an ONNX model — or a torch `nn.Module`, given
    `example_inputs` (a tuple of tensors: the export is specialised to their shapes), through torch.export.

    Options (see `kernorch.options.Options`): threads=2; cost="profile" (time candidate kernels on this
    machine, cached in SQLite) or "analytic" (roofline of `device`: "cpu" = this machine calibrated, or a
    preset); limits=OrchestrationLimits(); rewrite=True; rewrite_budget=60 (seconds of cost-guided rewrite
    search); screen=True (profiling skips fusions the GIR performance model predicts more than 2x slower than
    their primitives apart); cache_dir=None ($KERNORCH_CACHE or ~/.cache/kernorch).
    """
    chosen = (options or Options()).with_(**option_overrides)
    if is_torch_module(model):
        if example_inputs is None:
            raise KernorchError("compiling a torch module needs example_inputs=(tensor, ...), its positional inputs")
        model = export_to_onnx(model, example_inputs)
    elif example_inputs is not None:
        raise KernorchError("example_inputs is for torch modules; an ONNX model's input shapes come from the model "
                            "or from input_shapes")  # fmt: skip
    return compile_model(model, input_shapes, chosen, progress or Progress())


def load(directory: str | os.PathLike[str], threads: int | None = None,
         cache_dir: str | os.PathLike[str] | None = None, runtime: str = "kernels") -> CompiledModel:  # fmt: skip
    """Load a saved plan without re-tuning; refuses a corrupted, tampered or mismatched artifact. `runtime`:
    "kernels" (kernel by kernel) or "rprogram" (scheduled rTasks, calibrated in place when loaded)."""
    return load_model(directory, threads, Path(cache_dir) if cache_dir is not None else None, runtime)
