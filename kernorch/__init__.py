"""kernorch: optimal kernel orchestration for DNN inference graphs.

Pipeline (one package per stage): frontend → fission → rewrite → orchestrate → cost → codegen → runtime.
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
