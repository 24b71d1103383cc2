"""Operator fission (Korch §3): every ONNX operator becomes a small graph of primitives."""

from kernorch.fission.driver import fission
from kernorch.fission.registry import FISSION_RULES
from kernorch.fission import rules  # noqa: F401,E402  (registers every rule)

__all__ = ["FISSION_RULES", "fission"]
