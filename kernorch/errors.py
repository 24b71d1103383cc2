"""Errors kernorch raises on bad input. Each maps to CLI exit code 2 with a one-line message."""

from __future__ import annotations


class KernorchError(Exception):
    """Base class: a problem with the user's input, reported in one line (exit code 2)."""

    exit_code = 2


class InvalidModel(KernorchError):
    """The file is not a readable, valid ONNX model (truncated, not ONNX, fails the checker)."""


class UnsupportedOperator(KernorchError):
    """An operator, attribute value, dtype or opset kernorch has no faithful rule for.

    kernorch never guesses: anything outside what a rule handles is refused with this error.
    """

    def __init__(self, op_type: str, node_name: str, reason: str, attribute: str | None = None) -> None:
        self.op_type = op_type
        self.node_name = node_name
        self.attribute = attribute
        self.reason = reason
        where = f"attribute '{attribute}' of " if attribute else ""
        super().__init__(f"unsupported: {where}{op_type} node '{node_name}': {reason}")


class KernorchWarning(UserWarning):
    """A warning about the model or the run, which the CLI prints in one line."""


class FallbackWarning(KernorchWarning):
    """Some nodes had no kernorch rule and run whole through onnxruntime (not optimized, still exact)."""


class PeerWarning(KernorchWarning):
    """A peer of a benchmark cannot run the model (OpenVINO and onnxruntime's contrib operators): left out of the
    timing, said so."""


class NeedsTorch(KernorchError):
    """What was asked needs PyTorch, an optional dependency (`pip install 'kernorch[torch]'`)."""


class InputMismatch(KernorchError):
    """A run-time input has the wrong name, dtype or shape for the compiled graph."""


class ShapeError(KernorchError):
    """A model input has a symbolic dimension that was not bound with --input-shape."""
