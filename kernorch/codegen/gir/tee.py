"""A map phase whose values an earlier interchanged reduction already computes, stored by that reduction.

An instance norm of a map larger than a core's L2 (candy's [224, 224, 32]) is, in the phased schedule, a sum
for the mean, a sum of squared deviations for the variance, and a phase storing the deviations x - mean: three
passes reading the map. The variance's body computes every deviation already, once per element (its taps run
over all the map's positions, the channel loop inside), so storing each there ("tee": evaluate, store, go on)
leaves two passes, PowerFusion's merge of two read-after-read movements across phases.

The map phase qualifies when its whole value is a subtree of the reduction's body with its loop variables
renamed one to one onto the reduction's (its outer loops and taps: every element is stored exactly once), no
phase in between writes what it reads, and no later phase reads what it writes (it is written earlier now).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from kernorch.codegen.gir.reductions import bare_reduction, buffers_used, interchangeable
from kernorch.codegen.loops import KernelLoops, Phase, Tree, lit, substituted


def tee_maps_into_reductions(loops: KernelLoops) -> KernelLoops:
    """`loops` with each qualifying map phase moved into the body of the reduction computing its values."""
    if loops.schedule != "phased":
        return loops
    dtypes = {b.name: b.dtype for b in loops.buffers}
    phases = list(loops.phases)
    j = 0
    while j < len(phases):
        fused = _fuse(phases, j, dtypes)
        if fused is None:
            j += 1
            continue
        i, reduction = fused
        phases[i] = reduction
        del phases[j]
    return replace(loops, phases=phases)


def _fuse(phases: list[Phase], j: int, dtypes: dict[str, str]) -> tuple[int, Phase] | None:
    """(i, phase i with phase j's stores in its reduction's body), or None."""
    mapped = phases[j]
    if mapped.scalar or not mapped.loop_vars or _has(mapped.expr, "reduce"):
        return None
    reads = buffers_used(mapped.expr) | buffers_used(mapped.store_index)
    if any(mapped.target in buffers_used(p.expr) | buffers_used(p.store_index) for p in phases[j + 1 :]):
        # correct, but the rules raising a later phase's read to the cache reason from the writing phase's own
        # store and parallel structure, not from a store inside a reduction whose taps the threads split
        return None
    for i in range(j - 1, -1, -1):  # the nearest reduction first
        phase = phases[i]
        if phase.target in reads or phase.target == mapped.target or mapped.target in buffers_used(phase.expr):
            return None  # j reads what i writes, both write one buffer, or i reads what j writes
        found = interchangeable(phase, dtypes.get(phase.target, "float32"))
        if found is not None and found[2] is None:
            teed = _tee_into(phase, mapped, dtypes.get(phase.target, "float32"))
            if teed is not None:
                return i, teed
    return None


def _tee_into(phase: Phase, mapped: Phase, dtype: str) -> Phase | None:
    reduction = bare_reduction(phase.expr, dtype)
    assert reduction is not None  # interchangeable
    _, prim, rdtype, taps, body = reduction
    sizes = dict(zip(phase.loop_vars, phase.loop_sizes, strict=True)) | dict(taps)
    for subtree in _subtrees(body):
        binding: dict[str, Tree] = {}
        if not _match(mapped.expr, subtree, set(mapped.loop_vars), binding):
            continue
        if not _one_to_one(mapped, binding, sizes):
            continue
        # loop variables of one iteration, not bound by the match, are 0
        zeros = {v: lit(0) for v, n in zip(mapped.loop_vars, mapped.loop_sizes, strict=True) if n == 1}
        index = substituted(mapped.store_index, zeros | binding)
        new_body = _replace_first(body, subtree, ("tee", mapped.target, index, subtree))
        new_reduce = ("reduce", prim, rdtype, taps, new_body)
        expr = new_reduce if phase.expr[0] == "reduce" else (*phase.expr[:2], new_reduce)  # under its cast
        return replace(phase, expr=expr)
    return None


def _one_to_one(mapped: Phase, binding: dict[str, Tree], sizes: dict[str, int]) -> bool:
    """Every loop of the map longer than one renamed onto a distinct loop of the reduction of the same size,
    and every loop of the reduction longer than one reached: each element stored once."""
    targets = []
    for var, size in zip(mapped.loop_vars, mapped.loop_sizes, strict=True):
        bound = binding.get(var)
        if size == 1:
            if bound is not None and (bound[0] != "var" or sizes.get(bound[1]) != 1):
                return False
            continue
        if bound is None or bound[0] != "var" or sizes.get(bound[1]) != size:
            return False
        targets.append(bound[1])
    return len(set(targets)) == len(targets) == sum(1 for n in sizes.values() if n > 1)


def _match(pattern: Any, tree: Any, variables: set[str], binding: dict[str, Tree]) -> bool:
    """`tree` is `pattern` with its `variables` renamed consistently (each to a loop variable of `tree`)."""
    if isinstance(pattern, tuple) and len(pattern) == 2 and pattern[0] == "var" and pattern[1] in variables:
        if not (isinstance(tree, tuple) and len(tree) == 2 and tree[0] == "var"):
            return False
        return binding.setdefault(pattern[1], tree) == tree
    if isinstance(pattern, tuple):
        return isinstance(tree, tuple) and len(tree) == len(pattern) and \
            all(_match(p, t, variables, binding) for p, t in zip(pattern, tree, strict=True))  # fmt: skip
    return bool(pattern == tree)


_VALUES = ("load", "const", "op", "cast", "scalar", "table")  # value trees a tee may wrap or look inside


def _subtrees(tree: Any) -> Iterator[Tree]:
    """Value subtrees evaluated once per evaluation of `tree`, largest first (preorder): not inside a nested
    reduction (once per inner tap), a select's sides (a guarded side runs only where its indices are valid,
    so stores there would skip elements) or an index (a gather's)."""
    if not isinstance(tree, tuple) or not tree or tree[0] not in _VALUES:
        return
    yield tree
    if tree[0] in ("op", "cast"):
        for child in tree[1:]:
            yield from _subtrees(child)


def _replace_first(tree: Any, old: Tree, new: Tree) -> Any:
    done = [False]

    def walk(node: Any) -> Any:
        if done[0]:
            return node
        if node is old or (isinstance(node, tuple) and node == old):
            done[0] = True
            return new
        return tuple(walk(child) for child in node) if isinstance(node, tuple) else node

    return walk(tree)


def _has(tree: Any, kind: str) -> bool:
    return isinstance(tree, tuple) and bool(tree) and (tree[0] == kind or any(_has(t, kind) for t in tree[1:]))
