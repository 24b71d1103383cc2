"""Importing this package registers every fission rule (one small function per ONNX operator)."""

from kernorch.fission.rules import (  # noqa: F401
    attention,
    constants,
    einsum,
    elementwise,
    indexing,
    integer_linear,
    layout,
    linear,
    normalization,
    qoperator,
    quantize,
    recurrent,
    reduce,
    resize,
)
