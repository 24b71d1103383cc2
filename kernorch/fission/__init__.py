"""Operator fission (Korch §3): every ONNX operator becomes a small graph of primitives."""

from kernorch.fission import rules  # noqa: F401,E402  (registers every rule)
from kernorch.fission.driver import fallback_nodes, fission
from kernorch.fission.registry import FISSION_RULES

__all__ = ["FISSION_RULES", "fallback_nodes", "fission"]
