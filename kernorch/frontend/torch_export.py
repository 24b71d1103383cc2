"""PyTorch front end: an `nn.Module` (or a Dynamo FX graph) becomes an ONNX model through `torch.export`.

Why through ONNX rather than straight from the exported FX graph into kernorch's IR: `torch.onnx.export(...,
dynamo=True)` *is* `torch.export` followed by a maintained ATen → ONNX translation (onnxscript), and everything
after it — fission rules, their conformance tests against the ONNX reference, the onnxruntime fallback,
`kernorch check` — is already kernorch's verified ONNX path. A second translation from ATen would have to
re-earn all of that for every ATen op. Shapes are static: the export is specialised to the example inputs.

torch is imported only here, and only when a module is given: plans run without it.
"""

from __future__ import annotations

import contextlib
import io
import logging
import sys
import warnings
from collections.abc import Sequence
from typing import Any

import onnx

from kernorch.errors import KernorchError


class ExportFailed(KernorchError):
    """torch.export / the ONNX exporter could not take the module (data-dependent control flow, an op the
    exporter does not know, ...)."""


def is_torch_module(obj: Any) -> bool:
    """True for an nn.Module, checked without importing torch (a module object implies torch is loaded)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.nn.Module)


def export_to_onnx(module: Any, example_inputs: Sequence[Any], opset: int | None = None) -> onnx.ModelProto:
    """The module, in eval mode and specialised to the example inputs' shapes, as a self-contained ONNX model."""
    import torch

    if not isinstance(example_inputs, (tuple, list)) or not example_inputs:
        raise KernorchError("example_inputs must be a non-empty tuple of tensors (the module's positional inputs)")
    if any(not isinstance(t, torch.Tensor) for t in example_inputs):
        raise KernorchError("example_inputs must all be torch tensors")
    try:
        import onnxscript  # noqa: F401  (the exporter's translation library)
    except ImportError:
        raise KernorchError("exporting a torch module needs onnxscript (pip install 'kernorch[torch]')") from None
    training = module.training
    module.eval()
    quiet = io.StringIO()
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(quiet), _quiet_loggers(), torch.no_grad():
            warnings.simplefilter("ignore")
            program = torch.onnx.export(module, tuple(example_inputs), dynamo=True, optimize=True,
                                        opset_version=opset, verbose=False, external_data=False)  # fmt: skip
    except Exception as error:  # torch.export raises many kinds (UserError, Unsupported, TorchRuntimeError, ...)
        raise ExportFailed(f"torch.export could not export the module: {_cause(error)}") from None
    finally:
        module.train(training)
    if program is None:
        raise ExportFailed("torch.onnx.export returned no program")
    return program.model_proto  # type: ignore[no-any-return]


def _cause(error: BaseException) -> str:
    """One line: the exporter's own diagnosis when it gives one (an ATen op without an ONNX translation)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    for line in lines:
        if "No ONNX function found for" in line:
            return line[line.index("No ONNX function"):][:300]
    return f"{type(error).__name__}: {lines[0][:300]}" if lines else type(error).__name__


@contextlib.contextmanager
def _quiet_loggers() -> Any:
    """The exporter logs its progress at INFO/WARNING ("torchvision is not installed...", "Obtain model graph")."""
    names = ("torch.onnx", "torch._dynamo", "torch.export", "onnxscript", "onnx_ir")
    loggers = [logging.getLogger(name) for name in names]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)
