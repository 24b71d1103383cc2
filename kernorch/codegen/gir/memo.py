"""A kernel's description and rewritten GIR, made once per candidate while a graph is orchestrated.

Orchestrating a graph prices each candidate with the GIR model (describe, lower, rewrite), asks which
backend runs it (describe), and signs it for the profile database (describe, lower, rewrite, render): three
descriptions and two lowerings of the same kernel, a fifth of segformer_b0's tuning time in Python. Inside
`remembering()` each is made once per candidate. The memo lives only as long as that block (one
orchestration's candidates, every subgraph's: they are measured together at its end; the zoo's Qwen2 decoder
planned, profiles warm, in the same peak memory as with a memo per subgraph), on a graph nothing mutates
meanwhile, and is keyed by the graph object itself, so a rewritten or rebuilt graph never sees another graph's
description.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from kernorch.codegen.gir.graph import Gir
from kernorch.codegen.gir.lowering import lower
from kernorch.codegen.gir.rules import optimize
from kernorch.codegen.loops import KernelLoops, NotGeneratable, construct, simplified
from kernorch.codegen.target import CPU, Target
from kernorch.ir.kernel import CandidateKernel

T = TypeVar("T")
_active: list[dict[tuple[Any, ...], tuple[object, Any]]] = []


@contextmanager
def remembering() -> Iterator[None]:
    """Within the block, `described` and `rewritten` make each kernel's value once."""
    _active.append({})
    try:
        yield
    finally:
        _active.pop()


def remembered(what: tuple[Any, ...], kernel: CandidateKernel, make: Callable[[], T]) -> T:
    if not _active:
        return make()
    memo = _active[-1]
    key = (*what, id(kernel.graph), kernel.nodes, kernel.inputs, kernel.outputs)
    entry = memo.get(key)
    if entry is not None and entry[0] is kernel.graph:  # the same graph object, not one at a reused address
        if isinstance(entry[1], NotGeneratable):
            raise entry[1]
        value: T = entry[1]
        return value
    try:
        value = make()
    except NotGeneratable as refused:
        memo[key] = (kernel.graph, refused)
        raise
    memo[key] = (kernel.graph, value)
    return value


def constructed(kernel: CandidateKernel) -> KernelLoops:
    """construct(kernel) — the description before its indices are simplified, every refusal made — once per kernel
    while remembering: what a backend's verdict needs for every candidate."""
    return remembered(("constructed",), kernel, lambda: construct(kernel))


def described(kernel: CandidateKernel) -> KernelLoops:
    """describe(kernel), made once per kernel while remembering (raises NotGeneratable likewise): the constructed
    description, simplified."""
    return remembered(("loops",), kernel, lambda: simplified(constructed(kernel)))


def rewritten(kernel: CandidateKernel, target: Target = CPU) -> Gir:
    """The kernel's GIR for `target` after the rewrite rules, made once per kernel and target while remembering."""
    return remembered(("gir", target), kernel, lambda: optimize(lower(described(kernel), target)))
