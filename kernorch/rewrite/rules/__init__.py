"""Rewrite rules; importing this package registers every rule in REWRITE_RULES."""

from kernorch.rewrite.rules import algebra, cleanup, linear, recurrent, resize, window

__all__ = ["algebra", "cleanup", "linear", "recurrent", "resize", "window"]
