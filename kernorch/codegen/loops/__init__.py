"""The loop description of a fused memory-intensive kernel, independent of any language: phases of loops over
expression trees (description.py), the index algebra that simplifies them (indexing.py, splitting.py), which
kernels run as rows (rows.py) and resize taps computed with the reference's coordinate rules (resize_taps.py)."""

from kernorch.codegen.loops.description import (
    C_TYPES,
    SHORT_INNER,
    SUPPORTED_DTYPES,
    Buffer,
    Describer,
    KernelLoops,
    NotGeneratable,
    Phase,
    Tree,
    construct,
    count_kinds,
    describe,
    flatten,
    is_depthwise,
    lit,
    simplified,
    substituted,
)
from kernorch.codegen.loops.indexing import Digit, linearize, simplify_indices, to_tree
from kernorch.codegen.loops.splitting import split_innermost

__all__ = [
    "Buffer",
    "C_TYPES",
    "Describer",
    "Digit",
    "KernelLoops",
    "NotGeneratable",
    "Phase",
    "SHORT_INNER",
    "SUPPORTED_DTYPES",
    "Tree",
    "construct",
    "count_kinds",
    "describe",
    "flatten",
    "is_depthwise",
    "linearize",
    "lit",
    "simplified",
    "simplify_indices",
    "split_innermost",
    "substituted",
    "to_tree",
]
