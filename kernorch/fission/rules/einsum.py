"""Fission rule for Einsum: repeated letters become diagonal masks, letters nobody else needs are summed
out, and operands are contracted left to right as batched matrix products ([batch, M, K] × [batch, K, N]),
with transposes and reshapes around them; the last transpose puts the output letters in order."""

from __future__ import annotations

import string

import numpy as np

from kernorch.fission.registry import RuleContext, rule
from kernorch.fission.rules.common import reshape

# stand-ins for the axes an ellipsis covers (ONNX einsum letters are a-z and A-Z)
_ELLIPSIS_LETTERS = "0123456789"


def _parse(ctx: RuleContext, equation: str, ranks: list[int]) -> tuple[list[str], str]:
    """Each operand's letters and the output's, ellipses expanded to digit letters aligned on the right."""
    equation = equation.replace(" ", "")
    inputs_text, arrow, output_text = equation.partition("->")
    terms = inputs_text.split(",")
    if len(terms) != len(ranks):
        ctx.refuse(f"equation has {len(terms)} operands, node has {len(ranks)}", "equation")
    ellipsis_rank = 0
    for term, rank in zip(terms, ranks, strict=True):
        if "..." in term:
            ellipsis_rank = max(ellipsis_rank, rank - len(term.replace("...", "")))
    if ellipsis_rank > len(_ELLIPSIS_LETTERS):
        ctx.refuse("an ellipsis covering more than 10 axes", "equation")
    operands = []
    for term, rank in zip(terms, ranks, strict=True):
        covered = rank - len(term.replace("...", ""))
        letters = term.replace("...", _ELLIPSIS_LETTERS[ellipsis_rank - covered : ellipsis_rank]) if "..." in term \
            else term
        if len(letters) != rank or any(c not in string.ascii_letters + _ELLIPSIS_LETTERS for c in letters):
            ctx.refuse(f"term '{term}' does not match an operand of rank {rank}", "equation")
        operands.append(letters)
    if arrow:
        output = output_text.replace("...", _ELLIPSIS_LETTERS[:ellipsis_rank])
        if len(set(output)) != len(output) or any(c not in "".join(operands) for c in output):
            ctx.refuse(f"output '{output_text}' repeats a letter or names one no operand has", "equation")
    else:  # implicit output: the ellipsis axes, then the letters that appear once, alphabetically
        counts = {c: "".join(operands).count(c) for c in set("".join(operands))}
        output = _ELLIPSIS_LETTERS[:ellipsis_rank] + "".join(
            sorted(c for c, n in counts.items() if n == 1 and c not in _ELLIPSIS_LETTERS))
    return operands, output


@rule("Einsum", min_opset=12)
def einsum(ctx: RuleContext) -> list[str]:
    count = len(ctx.inputs)
    types = [ctx.type(i) for i in range(count)]
    dtype = types[0].dtype
    if dtype == "bool" or any(t.dtype != dtype for t in types):
        ctx.refuse("operands must share one numeric dtype")
    letters, output = _parse(ctx, ctx.attr("equation"), [t.rank for t in types])
    sizes: dict[str, int] = {}
    for term, t in zip(letters, types, strict=True):
        for c, d in zip(term, t.shape, strict=True):
            if sizes.get(c, 1) not in (1, d) and d != 1:
                ctx.refuse(f"letter '{c}' has sizes {sizes[c]} and {d}", "equation")
            sizes[c] = max(sizes.get(c, 1), d)
    operands = []
    for i, term in enumerate(letters):
        value, term = _diagonal(ctx, ctx.input(i), term)
        target = tuple(sizes[c] for c in term)
        if ctx.builder.type_of(value).shape != target:  # an ellipsis axis of size 1 broadcasts
            value = ctx.emit("expand", value, shape=target)
        operands.append((value, term))
    value, term = operands[0]
    for index in range(1, len(operands) + 1):
        after = "".join(t for _, t in operands[index + 1 :]) + output  # letters needed past this contraction
        value, term = _sum_out(ctx, value, term, "".join(t for _, t in operands[index : index + 1]) + after)
        if index == len(operands):
            break
        other, other_term = _sum_out(ctx, *operands[index], term + after)
        value, term = _contract(ctx, value, term, other, other_term, after, sizes)
    perm = tuple(term.index(c) for c in output)
    if perm != tuple(range(len(perm))):
        value = ctx.emit("transpose", value, perm=perm)
    return [value if value != ctx.input(0) else ctx.emit("identity", value)]


def _diagonal(ctx: RuleContext, value: str, term: str) -> tuple[str, str]:
    """A letter repeated within one operand ('ii') keeps the diagonal: mask with the identity, sum one copy."""
    while len(set(term)) < len(term):
        letter = next(c for c in term if term.count(c) > 1)
        first, second = term.index(letter), term.index(letter, term.index(letter) + 1)
        shape = ctx.builder.type_of(value).shape
        eye_shape = [shape[a] if a in (first, second) else 1 for a in range(len(term))]
        eye = np.eye(shape[first], dtype=ctx.builder.type_of(value).dtype).reshape(eye_shape)
        value = ctx.emit("reduce_sum", ctx.emit("mul", value, ctx.constant(eye, hint="diagonal")), axes=(second,))
        term = term[:second] + term[second + 1 :]
        value = reshape(ctx, value, [d for a, d in enumerate(shape) if a != second])
    return value, term


def _sum_out(ctx: RuleContext, value: str, term: str, needed: str) -> tuple[str, str]:
    """Sum the axes whose letters nothing later needs."""
    axes = tuple(a for a, c in enumerate(term) if c not in needed)
    if not axes:
        return value, term
    shape = ctx.builder.type_of(value).shape
    summed = ctx.emit("reduce_sum", value, axes=axes)
    kept = "".join(c for c in term if c in needed)
    return reshape(ctx, summed, [d for a, d in enumerate(shape) if a not in axes]), kept


def _contract(ctx: RuleContext, a: str, a_term: str, b: str, b_term: str, later: str,
              sizes: dict[str, int]) -> tuple[str, str]:  # fmt: skip
    """a × b as one batched matrix product: shared letters needed later are the batch, shared letters not
    needed later are contracted, the rest are the rows (a) and columns (b)."""
    batch = "".join(c for c in a_term if c in b_term and c in later)
    inner = "".join(c for c in a_term if c in b_term and c not in later)
    rows = "".join(c for c in a_term if c not in b_term)
    cols = "".join(c for c in b_term if c not in a_term)

    def arrange(value: str, term: str, order: str, shape: list[int]) -> str:
        perm = tuple(term.index(c) for c in order)
        if perm != tuple(range(len(perm))):
            value = ctx.emit("transpose", value, perm=perm)
        return reshape(ctx, value, shape)

    def size(group: str) -> int:
        return int(np.prod([sizes[c] for c in group], dtype=np.int64))

    left = arrange(a, a_term, batch + rows + inner, [size(batch), size(rows), size(inner)])
    right = arrange(b, b_term, batch + inner + cols, [size(batch), size(inner), size(cols)])
    product = ctx.emit("matmul", left, right)
    result = batch + rows + cols
    return reshape(ctx, product, [sizes[c] for c in result]), result
