"""kernorch: optimal kernel orchestration for DNN inference graphs.

Pipeline (one package per stage, run in this order by pipeline.py):

    frontend → fission → rewrite → layout → precision → orchestrate (priced by cost) → codegen → runtime
                                                         └ validate: the cheapest plans timed end to end

frontend/ reads ONNX (and torch modules through torch.export); fission/ turns each node into primitives (ir/);
rewrite/ applies algebraic and fusion-enabling rules; layout/ and precision/ decide channels-last and bf16 per
value and primitive; orchestrate/ picks kernels with an optimal binary linear program over cost/'s prices;
codegen/ renders the kernels (generated C, oneDNN calls, native kernels, Triton) and the whole-plan program;
runtime/ loads and runs a plan (schedule/: rPrograms). shapes/ serves models with symbolic dims (a plan per
shape, padded buckets, saved families); api.py is `compile`/`load`; cli/ the `kernorch` command; tools/ what the
commands do (check, bench, explain, conformance); devtools/ the developers' tools (mutate, sanitize, soak).
"""

import sys

from kernorch.api import CompiledModel, DynamicModel, GpuModel, compile, load
from kernorch.errors import InputMismatch, InvalidModel, KernorchError, ShapeError, UnsupportedOperator
from kernorch.fission import fission
from kernorch.frontend import import_model
from kernorch.options import Options, OrchestrationLimits
from kernorch.runtime import run_reference

__version__ = "0.1.0"

if sys.modules.get("torch") is not None:  # torch.compile(backend="kernorch") from here on; the entry
    # point covers a torch imported later
    from kernorch.torch_backend import register as _register_torch_backend

    _register_torch_backend()

__all__ = [
    "CompiledModel",
    "DynamicModel",
    "GpuModel",
    "compile",
    "load",
    "InputMismatch",
    "InvalidModel",
    "KernorchError",
    "ShapeError",
    "UnsupportedOperator",
    "Options",
    "OrchestrationLimits",
    "fission",
    "import_model",
    "run_reference",
]
