"""kernorch: optimal kernel orchestration for DNN inference graphs.

Pipeline (one package per stage): frontend → fission → rewrite → orchestrate → cost → codegen → runtime.
"""

from kernorch.api import CompiledModel, compile, load
from kernorch.errors import InputMismatch, InvalidModel, KernorchError, ShapeError, UnsupportedOperator
from kernorch.fission import fission
from kernorch.frontend import import_model
from kernorch.options import Options, OrchestrationLimits
from kernorch.runtime import run_reference

__version__ = "0.1.0"

__all__ = [
    "CompiledModel",
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
