"""Shapes: one compiled model for every shape a model's symbolic dims allow (dynamic.py), and the proof of when a
call may be padded up to a prepared bucket instead of specialised (padding.py)."""

from kernorch.shapes.dynamic import DynamicModel, Memo, is_family, load_dynamic
from kernorch.shapes.padding import PaddingProof, prove_paddable

__all__ = ["DynamicModel", "Memo", "PaddingProof", "is_family", "load_dynamic", "prove_paddable"]
