"""Rewrite rules; importing this package registers every rule in REWRITE_RULES."""

from kernorch.rewrite.rules import algebra, branches, cleanup, linear, quantization, recurrent, resize, window

__all__ = ["algebra", "branches", "cleanup", "linear", "quantization", "recurrent", "resize", "window"]
