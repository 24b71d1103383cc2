"""Describe a fused memory-intensive kernel as loops over expression trees, independent of any language.

A kernel becomes `KernelLoops`: its buffers and a list of phases. Each phase loops over a shape and
stores an expression per element (a kernel output, or a reduction/pooling result kept in scratch). An
expression tree inlines every producer inside the kernel; layout primitives only transform indices.

Two schedules:
- row: every primitive is elementwise or a reduction over the same axes R of the same shape S
  (softmax, layer/instance norm). One parallel loop over the rows; per row the reductions run into
  scalars and the outputs are written, so the row stays in cache.
- phased: any mix (layout, pooling, resize...): each reduction/pooling result is materialized in a
  scratch buffer by its own loop nest, then each output is computed by its own loop nest.

Trees are tuples: index ('var', name) | ('lit', int) | ('+'|'-'|'*'|'/'|'%'|'min'|'max', a, b)
| ('sel', cond, a, b) with cond ('<'|'>='|'=='|'&&', a, b) | ('index', value_expr, size) (a value read as
an index, wrapped into range); values ('load', buffer, index...) | ('const', number, dtype)
| ('op', prim, dtype, args...) | ('cast', dtype, a) | ('where', c, a, b) | ('scalar', slot)
| ('reduce', prim, dtype, loops, body) with loops ((var, size), ...) | ('table', name, index).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from kernorch.codegen.loops.indexing import simplify, simplify_indices
from kernorch.codegen.loops.resize_taps import Periodic, periodic_taps, residue_factor, resize_taps
from kernorch.codegen.loops.rows import ancestors, kept_in_row, row_schedule
from kernorch.ir.graph import Graph, Node
from kernorch.ir.kernel import CandidateKernel
from kernorch.ir.primitives import PRIMITIVES, Kind

Tree = tuple[Any, ...]
MAX_TREE_NODES = 4000
SHORT_INNER = 4  # an innermost loop this short is unrolled, and the loop outside it vectorized (sharing.py)


class NotGeneratable(Exception):
    """The kernel is outside what this codegen handles; the message says why."""


@dataclass(frozen=True)
class Buffer:
    name: str  # C-safe identifier chosen by codegen, never a graph value name
    dtype: str
    shape: tuple[int, ...]
    role: str  # "input", "output" or "scratch"


@dataclass
class Phase:
    """Loops `loop_vars` over `loop_sizes` (outermost first), storing `expr` at `target[store_index]`.
    In the row schedule these loops run inside the row loop; a scalar phase has no loops and no store."""

    target: str  # buffer name, or scalar slot in the row schedule
    loop_vars: tuple[str, ...]
    loop_sizes: tuple[int, ...]
    expr: Tree
    store_index: Tree = ("lit", 0)
    scalar: bool = False
    # the innermost loop runs the residues r of an output axis split as f·q + r (an integer-factor upsampling
    # along it, `residue_factor`): unrolled whatever its length, the loop over q around it vectorized
    residues: bool = False


@dataclass
class KernelLoops:
    buffers: list[Buffer]
    phases: list[Phase]
    schedule: str  # "row" or "phased"
    row_shape: tuple[int, ...] = ()  # row schedule: the outer (parallel) index space
    row_vars: tuple[str, ...] = ()
    tables: dict[str, np.ndarray] = field(default_factory=dict)  # constant lookup tables (resize)

    @property
    def inputs(self) -> list[Buffer]:
        return [b for b in self.buffers if b.role == "input"]

    @property
    def outputs(self) -> list[Buffer]:
        return [b for b in self.buffers if b.role == "output"]


SUPPORTED_DTYPES = {"float32", "float64", "int64", "int32", "int16", "uint16", "int8", "uint8", "bool", "bfloat16"}
# bfloat16 is storage only: a kernel's cast to it computes in float (rounded, ko_bf16_round) and its store writes
# the top 16 bits; a load widens them to float. Only layout primitives that move values unchanged (and a cast)
# read one in generated C: arithmetic on bfloat16 is the linear primitives' (Describer.check)
BF16_READERS = frozenset({"transpose", "reshape", "slice", "split", "identity", "cast"})
C_TYPES = {"float32": "float", "float64": "double", "int64": "int64_t", "int32": "int32_t", "int16": "int16_t",
           "uint16": "uint16_t", "int8": "int8_t", "uint8": "uint8_t", "bool": "uint8_t",
           "bfloat16": "uint16_t"}  # fmt: skip
UNSUPPORTED_PRIMS = {"lstm_recurrence", "lstm_stack"}


# ----------------------------------------------------------------------------------------- index trees

def lit(v: int) -> Tree:
    return ("lit", int(v))


def add(a: Tree, b: Tree) -> Tree:
    if a[0] == "lit" and b[0] == "lit":
        return lit(a[1] + b[1])
    if a == lit(0):
        return b
    if b == lit(0):
        return a
    return ("+", a, b)


def mul(a: Tree, b: Tree) -> Tree:
    if a[0] == "lit" and b[0] == "lit":
        return lit(a[1] * b[1])
    if a == lit(0) or b == lit(0):
        return lit(0)
    if a == lit(1):
        return b
    if b == lit(1):
        return a
    return ("*", a, b)


def div(a: Tree, n: int) -> Tree:
    if n == 1:
        return a
    if a[0] == "lit":
        return lit(a[1] // n)
    return ("/", a, lit(n))


def mod(a: Tree, n: int) -> Tree:
    if n == 1:
        return lit(0)
    if a[0] == "lit":
        return lit(a[1] % n)
    return ("%", a, lit(n))


def part(var: str, sizes: tuple[int, ...], k: int) -> Tree:
    """Coordinate k of a loop variable that runs over the merged (flattened) axes `sizes`."""
    return ("part", var, sizes, k)


def flatten(index: list[Tree], shape: tuple[int, ...]) -> Tree:
    """Row-major flat offset; a complete run of a merged variable's parts collapses back to the variable."""
    flat = lit(0)
    j = 0
    while j < len(index):
        i = index[j]
        if i[0] == "part" and i[3] == 0:
            sizes = i[2]
            run = index[j: j + len(sizes)]
            if tuple(shape[j: j + len(sizes)]) == sizes and run == [part(i[1], sizes, k) for k in range(len(sizes))]:
                flat = add(mul(flat, lit(int(np.prod(sizes)))), ("var", i[1]))
                j += len(sizes)
                continue
        flat = add(mul(flat, lit(shape[j])), i)
        j += 1
    return flat


def substituted(tree: Any, binding: dict[str, Tree]) -> Any:
    """`tree` with each variable named in `binding` replaced by its tree (a renamed loop variable, a constant)."""
    if isinstance(tree, tuple) and len(tree) == 2 and tree[0] == "var" and tree[1] in binding:
        return binding[tree[1]]
    if isinstance(tree, tuple):
        return tuple(substituted(child, binding) for child in tree)
    return tree


def has_parts(tree: Any) -> bool:
    if not isinstance(tree, tuple):
        return False
    return tree[:1] == ("part",) or any(has_parts(t) for t in tree)


def unflatten(flat: Tree, shape: tuple[int, ...]) -> list[Tree]:
    index: list[Tree] = []
    stride = int(np.prod(shape, dtype=np.int64))
    for size in shape:
        stride //= size if size else 1
        index.append(mod(div(flat, stride), size) if size else lit(0))
    return index


def reshaped_index(index: list[Tree], out_shape: tuple[int, ...], in_shape: tuple[int, ...]) -> list[Tree]:
    """The input index of a reshape's output element, group by group: both shapes cut where their running
    products meet (size-1 axes aside) into runs of neighbouring axes that a split or a merge maps onto each
    other, so an axis that keeps its size reads its index as it is and a split axis is recombined without a
    division. (Through one flat offset, lraspp's [1, 21, 256] -> [1, 21, 16, 16] before a bilinear resize read
    every element at `((16 t + c) / 256) % 21`: 829 µs for 344K outputs.)"""
    if 0 in in_shape or 0 in out_shape:
        return unflatten(flatten(index, out_shape), in_shape)
    outs = [(j, d) for j, d in enumerate(out_shape) if d != 1]
    ins = [(j, d) for j, d in enumerate(in_shape) if d != 1]
    in_index = [lit(0)] * len(in_shape)
    a = b = 0
    while a < len(outs) and b < len(ins):
        group_out, group_in = [outs[a]], [ins[b]]
        out_size, in_size = outs[a][1], ins[b][1]
        a, b = a + 1, b + 1
        while out_size != in_size:  # equal element counts: the runs meet by the end at the latest
            if out_size < in_size:
                group_out.append(outs[a])
                out_size, a = out_size * outs[a][1], a + 1
            else:
                group_in.append(ins[b])
                in_size, b = in_size * ins[b][1], b + 1
        if len(group_out) == len(group_in) == 1:
            in_index[group_in[0][0]] = index[group_out[0][0]]
            continue
        flat = flatten([index[j] for j, _ in group_out], tuple(d for _, d in group_out))
        stride = in_size
        for k, (j, size) in enumerate(group_in):  # the group's flat offset is below in_size: no remainder first
            stride //= size
            in_index[j] = div(flat, stride) if k == 0 else mod(div(flat, stride), size)
    return in_index


def tree_size(tree: Any) -> int:
    if not isinstance(tree, tuple):
        return 1
    return 1 + sum(tree_size(t) for t in tree)


def count_kinds(tree: Any, kinds: tuple[str, ...]) -> int:
    """How many nodes of `tree` are of one of `kinds` ("reduce", "/", ...)."""
    if not isinstance(tree, tuple) or not tree:
        return 0
    return int(tree[0] in kinds) + sum(count_kinds(child, kinds) for child in tree[1:])


# ------------------------------------------------------------------------------------ the description

class Describer:
    def __init__(self, kernel: CandidateKernel) -> None:
        self.kernel = kernel
        self.graph: Graph = kernel.graph
        self.nodes = {o: self.graph.nodes[i] for i in kernel.nodes for o in self.graph.nodes[i].outputs}
        self.buffers: list[Buffer] = []
        self.buffer_of: dict[str, str] = {}
        self.tables: dict[str, np.ndarray] = {}
        self.materialized: dict[str, str] = {}  # value -> scratch buffer (phased) or scalar slot (row)
        self.var_counter = 0
        # integer upsampling factors found on each loop variable read as an axis of a resize (a plain index)
        self.residue_hints: dict[str, set[int]] = {}
        # the innermost loop being described as f·q + r: (q, r, f)
        self.residue_split: tuple[str, str, int] | None = None

    def table(self, values: np.ndarray) -> str:
        """The name of a constant table holding `values` (one table per distinct content: rebuilding an
        expression, as merging axes does, finds the tables it made before)."""
        for name, existing in self.tables.items():
            if existing.dtype == values.dtype and existing.shape == values.shape and np.array_equal(existing, values):
                return name
        name = f"tab{len(self.tables)}"
        self.tables[name] = values
        return name

    def fresh_var(self) -> str:
        self.var_counter += 1
        return f"r{self.var_counter}"

    def check(self) -> None:
        for i in self.kernel.nodes:
            node = self.graph.nodes[i]
            kind = PRIMITIVES[node.prim].kind
            if (kind in (Kind.LINEAR, Kind.OPAQUE) and not is_depthwise(self.graph, node)) \
                    or node.prim in UNSUPPORTED_PRIMS:  # fmt: skip
                raise NotGeneratable(f"{node.prim} is not a memory-intensive primitive")
            for value in (*node.inputs, *node.outputs):
                if self.graph.types[value].dtype not in SUPPORTED_DTYPES:
                    raise NotGeneratable(f"dtype {self.graph.types[value].dtype} is not generated")
            if node.prim not in BF16_READERS and any(self.graph.types[v].dtype == "bfloat16" for v in node.inputs):
                raise NotGeneratable(f"{node.prim} reads a bfloat16 value: generated kernels only move them")

    def add_buffer(self, value: str, role: str) -> str:
        name = f"{role[:3]}{sum(b.role == role for b in self.buffers)}"
        t = self.graph.types[value]
        self.buffers.append(Buffer(name, t.dtype, t.shape, role))
        self.buffer_of[value] = name
        return name

    # ---- value expressions
    def value(self, name: str, index: list[Tree]) -> Tree:
        if name in self.materialized:
            slot = self.materialized[name]
            if slot.startswith("acc"):
                return ("scalar", slot)
            return ("load", slot, flatten(index, self.graph.types[name].shape))
        if name not in self.nodes:
            constant = self.graph.constants.get(name)
            if constant is not None and constant.size == 1:  # a literal: the compiler folds it (max with a number
                return ("const", constant.reshape(()).item(), self.graph.types[name].dtype)  # is one instruction)
            return ("load", self.buffer_of[name], flatten(index, self.graph.types[name].shape))
        node = self.nodes[name]
        return self.node_expr(node, node.outputs.index(name), index)

    def broadcast_index(self, value: str, out_shape: tuple[int, ...], index: list[Tree]) -> list[Tree]:
        shape = self.graph.types[value].shape
        offset = len(out_shape) - len(shape)
        return [lit(0) if size == 1 and out_shape[offset + j] != 1 else index[offset + j]
                for j, size in enumerate(shape)]  # fmt: skip

    def node_expr(self, node: Node, output: int, index: list[Tree]) -> Tree:
        prim, attrs = node.prim, node.attr_dict
        out_type = self.graph.types[node.outputs[output]]
        kind = PRIMITIVES[prim].kind
        if kind == Kind.ELEMENTWISE:
            args = [self.value(v, self.broadcast_index(v, out_type.shape, index)) for v in node.inputs]
            if prim == "where":
                return ("where", *args)
            if prim == "cast":
                return ("cast", out_type.dtype, args[0])
            if prim == "identity":
                return args[0]
            return ("op", prim, self.graph.types[node.inputs[0]].dtype, *args)
        if prim == "expand":
            return self.value(node.inputs[0], self.broadcast_index(node.inputs[0], out_type.shape, index))
        if prim == "reshape":
            in_shape = self.graph.types[node.inputs[0]].shape
            return self.value(node.inputs[0], reshaped_index(index, out_type.shape, in_shape))
        if prim == "transpose":
            in_index: list[Tree] = [lit(0)] * len(index)
            for j, p in enumerate(attrs["perm"]):
                in_index[p] = index[j]
            return self.value(node.inputs[0], in_index)
        if prim == "slice":
            return self.value(node.inputs[0], [add(lit(start), mul(i, lit(step)))
                                               for i, (start, _, step) in zip(index, attrs["ranges"], strict=True)])
        if prim == "split":
            axis = attrs["axis"]
            offset = sum(attrs["sizes"][:output])
            shifted = list(index)
            shifted[axis] = add(index[axis], lit(offset))
            return self.value(node.inputs[0], shifted)
        if prim == "concat":
            return self.concat_expr(node, index)
        if prim == "pad":
            return self.pad_expr(node, index)
        if prim == "gather":
            return self.gather_expr(node, index)
        if prim == "gather_elements":
            axis = attrs["axis"]
            size = self.graph.types[node.inputs[0]].shape[axis]
            picked = list(index)
            picked[axis] = ("index", self.value(node.inputs[1], index), size)
            return self.value(node.inputs[0], picked)
        if prim == "resize":
            return self.resize_expr(node, index)
        if prim in ("reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "window_max", "window_sum"):
            return self.reduction_tree(node, index)
        if is_depthwise(self.graph, node):
            return self.depthwise_tree(node, index)
        raise NotGeneratable(f"no code generation for {prim}")

    def concat_expr(self, node: Node, index: list[Tree]) -> Tree:
        axis = node.attr("axis")
        pieces = []
        start = 0
        for value in node.inputs:
            size = self.graph.types[value].shape[axis]
            shifted = list(index)
            shifted[axis] = add(index[axis], lit(-start))
            pieces.append((start + size, self.value(value, shifted)))
            start += size
        expr = pieces[-1][1]
        for end, piece in reversed(pieces[:-1]):
            expr = ("where", ("<", index[axis], lit(end)), piece, expr)
        return expr

    def pad_expr(self, node: Node, index: list[Tree]) -> Tree:
        pads, mode = node.attr("pads"), node.attr("mode")
        in_shape = self.graph.types[node.inputs[0]].shape
        rank = len(in_shape)
        source: list[Tree] = []
        inside: Tree | None = None
        for j, size in enumerate(in_shape):
            shifted = add(index[j], lit(-pads[j]))
            if not (pads[j] or pads[rank + j]):
                source.append(index[j])
                continue
            if mode == "constant":
                source.append(shifted)
                cond = ("&&", (">=", shifted, lit(0)), ("<", shifted, lit(size)))
                inside = cond if inside is None else ("&&", inside, cond)
            elif mode == "edge":
                source.append(("max", lit(0), ("min", shifted, lit(size - 1))))
            elif mode == "reflect":
                # pads < size: one reflection at each end is enough
                low = ("sel", ("<", shifted, lit(0)), ("-", lit(0), shifted), shifted)
                source.append(("sel", (">=", low, lit(size)), ("-", lit(2 * size - 2), low), low))
            elif mode == "wrap":
                source.append(("%", ("+", ("%", shifted, lit(size)), lit(size)), lit(size)))
            else:
                raise NotGeneratable(f"pad mode {mode}")
        loaded = self.value(node.inputs[0], source)
        if inside is None:
            return loaded
        dtype = self.graph.types[node.inputs[0]].dtype
        return ("where", inside, loaded, ("const", node.attr("value"), dtype))

    def gather_expr(self, node: Node, index: list[Tree]) -> Tree:
        axis = node.attr("axis")
        data_shape = self.graph.types[node.inputs[0]].shape
        index_rank = self.graph.types[node.inputs[1]].rank
        picked = ("index", self.value(node.inputs[1], index[axis: axis + index_rank]), data_shape[axis])
        return self.value(node.inputs[0], [*index[:axis], picked, *index[axis + index_rank:]])

    def resize_expr(self, node: Node, index: list[Tree]) -> Tree:
        attrs = node.attr_dict
        in_shape = self.graph.types[node.inputs[0]].shape
        # Per axis: taps and weights, computed here with the reference code's own coordinate rules.
        taps_per_axis: list[list[tuple[Tree, Tree | None]]] = []
        for axis, (size_in, size_out) in enumerate(zip(in_shape, attrs["sizes"], strict=True)):
            rules = (size_in, size_out, float(attrs["scales"][axis]), attrs["mode"], attrs["coordinate_mode"],
                     attrs["nearest_mode"], float(attrs["cubic_coeff_a"]), bool(attrs["exclude_outside"]))
            table = resize_taps(*rules)
            if table is None:
                taps_per_axis.append([(index[axis], None)])
                continue
            periodic = periodic_taps(*rules)
            if periodic is not None and index[axis][0] == "var":  # the loop over it may be split by the factor
                self.residue_hints.setdefault(index[axis][1], set()).add(periodic[0])
            split = self.residue_split
            if periodic is not None and split is not None and split[2] % periodic[0] == 0 and \
                    index[axis] == add(mul(("var", split[0]), lit(split[2])), ("var", split[1])):  # fmt: skip
                taps_per_axis.append(self.periodic_taps(periodic, table, split, size_in))
                continue
            taps, weights = table
            width = taps.shape[1]
            tap_table, weight_table = self.table(taps.reshape(-1)), self.table(weights.reshape(-1))
            choices: list[tuple[Tree, Tree | None]] = []
            for t in range(width):
                position = add(mul(index[axis], lit(width)), lit(t))
                choices.append((("table", tap_table, position), ("table", weight_table, position)))
            taps_per_axis.append(choices)
        dtype = self.graph.types[node.inputs[0]].dtype
        total: Tree | None = None
        combos: list[tuple[list[Tree], list[Tree]]] = [([], [])]
        for choices in taps_per_axis:
            combos = [(idx + [tap], w + ([weight] if weight is not None else [])) for idx, w in combos
                      for tap, weight in choices]  # fmt: skip
        for idx, ws in combos:
            term = self.value(node.inputs[0], idx)
            for weight in ws:
                term = ("op", "mul", dtype, term, ("cast", dtype, weight))
            total = term if total is None else ("op", "add", dtype, total, term)
        assert total is not None
        return total

    def periodic_taps(self, periodic: Periodic, table: tuple[np.ndarray, np.ndarray], split: tuple[str, str, int],
                      size_in: int) -> list[tuple[Tree, Tree | None]]:  # fmt: skip
        """A resize axis upsampled by g, read at f·q + r (g divides f): output g·q' + r' reads inputs
        q' + offsets[r', t] with weights[r', t]. Both tables are indexed by the residue alone (a constant
        once the residue loop is unrolled), so every read is unit-stride in q. Within `low` of the axis' start
        and `high` of its end, where coordinates and taps are clamped, an output reads its row of the full
        table instead: selects on q the loop over q is cut at."""
        factor, offsets, weights, low, high = periodic
        q_var, r_var, f = split
        q: Tree = ("var", q_var)
        r: Tree = ("var", r_var)
        output = add(mul(q, lit(f)), r)  # the position along the axis
        if f != factor:
            q, r = add(mul(q, lit(f // factor)), div(r, factor)), mod(r, factor)
        # the border rows of the table: the first factor·low outputs, then those from factor·(size_in - high)
        head, tail = factor * low, factor * (size_in - high)
        rows = np.r_[0:head, tail: factor * size_in]
        # (condition, the first output it holds for, where that output's row is in the border rows)
        borders = ([(("<", q, lit(low)), 0, 0)] if low else []) + \
            ([((">=", q, lit(size_in - high)), tail, head)] if high else [])  # fmt: skip
        width = offsets.shape[1]
        offset_table, tap_table = self.table(offsets.reshape(-1)), self.table(table[0][rows].reshape(-1))
        # one weight table, the pattern's rows then the border rows: a weight is one read whichever it takes
        weight_table = self.table(np.concatenate([weights.reshape(-1), table[1][rows].reshape(-1)]))
        choices: list[tuple[Tree, Tree | None]] = []
        for t in range(width):
            in_pattern = add(mul(r, lit(width)), lit(t))
            tap: Tree = add(q, ("table", offset_table, in_pattern))
            position = in_pattern
            for border, first, row in borders:
                in_border = add(mul(add(output, lit(row - first)), lit(width)), lit(t))
                tap = ("sel", border, ("table", tap_table, in_border), tap)
                position = ("sel", border, add(in_border, lit(weights.size)), position)
            choices.append((tap, ("table", weight_table, position)))
        return choices

    def reduction_tree(self, node: Node, index: list[Tree]) -> Tree:
        """A reduction (or pooling window) as a loop nest, for materialization into scratch or a scalar."""
        prim, attrs = node.prim, node.attr_dict
        x = node.inputs[0]
        in_shape = self.graph.types[x].shape
        dtype = self.graph.types[x].dtype
        if prim.startswith("reduce_"):
            loops = []
            in_index = list(index)
            for axis in attrs["axes"]:
                var = self.fresh_var()
                loops.append((var, in_shape[axis]))
                in_index[axis] = ("var", var)
            return ("reduce", prim, dtype, tuple(loops), self.value(x, in_index))
        kernel, strides, pads, dilations = attrs["kernel"], attrs["strides"], attrs["pads"], attrs["dilations"]
        spatial = len(kernel)
        lead = len(in_shape) - spatial
        loops, in_index, conds = [], list(index[:lead]), None
        for j in range(spatial):
            if (kernel[j], strides[j], dilations[j], pads[j], pads[spatial + j]) == (1, 1, 1, 0, 0):
                # an axis the window does not span is the output's own: no tap loop, no check, and the axes
                # around it can merge (a pool separated per axis reads whole rows)
                in_index.append(index[lead + j])
                continue
            var = self.fresh_var()
            loops.append((var, kernel[j]))
            start = add(mul(index[lead + j], lit(strides[j])), lit(-pads[j]))
            position = add(start, mul(("var", var), lit(dilations[j])))
            in_index.append(position)
            out_size = self.graph.types[node.outputs[0]].shape[lead + j]
            if pads[j] == 0 and (out_size - 1) * strides[j] + (kernel[j] - 1) * dilations[j] < in_shape[lead + j]:
                continue  # never outside the input (e.g. the channel axis of channels-last pooling): no check
            cond = ("&&", (">=", position, lit(0)), ("<", position, lit(in_shape[lead + j])))
            conds = cond if conds is None else ("&&", conds, cond)
        reducer = "reduce_max" if prim == "window_max" else "reduce_sum"
        body = self.value(x, in_index)
        if not loops:  # a window of one element everywhere: the element itself
            return body
        return ("reduce", reducer, dtype, tuple(loops), body if conds is None else ("guard", conds, body))

    def depthwise_tree(self, node: Node, index: list[Tree]) -> Tree:
        """Σ over the taps of x[n, tap position, c] · w[c, 0, taps] (channels-last, or the NCHW equivalent)."""
        x, w = node.inputs
        attrs = node.attr_dict
        in_shape = self.graph.types[x].shape
        kernel = self.graph.types[w].shape[2:]
        spatial = len(kernel)
        last = bool(attrs.get("channels_last", False))
        channel = index[-1] if last else index[1]
        first = 1 if last else 2  # first spatial axis
        loops, conds = [], None
        in_index = list(index)
        taps: list[Tree] = []
        for j in range(spatial):
            var = self.fresh_var()
            loops.append((var, kernel[j]))
            taps.append(("var", var))
            position = add(add(mul(index[first + j], lit(attrs["strides"][j])), lit(-attrs["pads"][j])),
                           mul(("var", var), lit(attrs["dilations"][j])))  # fmt: skip
            in_index[first + j] = position
            if attrs["pads"][j] or attrs["pads"][spatial + j]:
                cond = ("&&", (">=", position, lit(0)), ("<", position, lit(in_shape[first + j])))
                conds = cond if conds is None else ("&&", conds, cond)
        if w in self.graph.constants:
            # the constant filters re-laid [taps..., C]: the inner loop over channels reads them unit-stride
            name = f"dw{len(self.tables)}"
            self.tables[name] = np.moveaxis(self.graph.constants[w][:, 0], 0, -1).reshape(-1).astype(np.float32)
            weight: Tree = ("table", name, flatten([*taps, channel], (*kernel, in_shape[-1] if last else in_shape[1])))
        else:
            weight = self.value(w, [channel, lit(0), *taps])
        body = ("op", "mul", "float32", self.value(x, in_index), weight)
        return ("reduce", "reduce_sum", "float32", tuple(loops), body if conds is None else ("guard", conds, body))


def is_depthwise(graph: Graph, node: Node) -> bool:
    """A float32 conv with one filter per channel: a per-channel window reduction, generated like pooling (a bf16
    one multiplies rounded operands: a library call)."""
    if node.prim != "conv" or graph.types[node.outputs[0]].dtype != "float32" or node.attr("precision", "f32") != "f32":
        return False
    x, w = (graph.types[v] for v in node.inputs)
    channels = x.shape[-1] if node.attr("channels_last", False) else x.shape[1]
    return node.attr("group") == channels == w.shape[0] and w.shape[1] == 1


def describe(kernel: CandidateKernel) -> KernelLoops:
    """Build the loop description of a memory-intensive kernel, or raise NotGeneratable."""
    return simplified(construct(kernel))


def construct(kernel: CandidateKernel) -> KernelLoops:
    """The loop description with its indices as built, or NotGeneratable: every refusal is made here, so this
    alone is a backend's verdict (the simplification that follows never refuses and costs as much again)."""
    d = Describer(kernel)
    d.check()
    graph = kernel.graph
    for value in kernel.inputs:
        if graph.types[value].dtype not in SUPPORTED_DTYPES:
            raise NotGeneratable(f"input dtype {graph.types[value].dtype}")
        d.add_buffer(value, "input")
    for value in kernel.outputs:
        d.add_buffer(value, "output")
    nodes = [graph.nodes[i] for i in kernel.nodes]
    reductions = [n for n in nodes if (PRIMITIVES[n.prim].kind == Kind.REDUCE and n.prim != "expand")
                  or is_depthwise(graph, n)]  # fmt: skip
    row = row_schedule(graph, nodes, reductions, kernel.outputs)
    phases: list[Phase] = []
    if row is not None:
        full_shape, axes = row
        row_shape = tuple(1 if a in axes else s for a, s in enumerate(full_shape))
        row_vars = tuple(f"o{j}" for j in range(len(full_shape)))
        outer_index = [lit(0) if a in axes else ("var", row_vars[a]) for a in range(len(full_shape))]
        kept = kept_in_row(graph, nodes, reductions, kernel.outputs, full_shape)
        before = [n for n in reductions if kept is None or kept[0] not in ancestors(graph, nodes, n)]
        for n in reductions:
            if kept is not None and n is next((r for r in reductions if r not in before), None):
                value, target = kept  # computed once into the row of an output buffer, read back from the cache
                phases.append(_inner_row_phase(d, d.buffer_of[target], full_shape, axes, outer_index,
                                               lambda index, value=value: d.value(value, index)))  # fmt: skip
                d.materialized[value] = d.buffer_of[target]
            tree = d.node_expr(n, 0, outer_index)
            slot = f"acc{len(d.materialized)}"
            phases.append(Phase(slot, (), (), tree, scalar=True))
            d.materialized[n.outputs[0]] = slot
        # the output holding the kept value overwrites it: written last, after every other output has read it
        ordered = sorted(kernel.outputs, key=lambda o: kept is not None and o == kept[1])
        for value in ordered:
            if kept is not None and value == kept[0]:
                continue  # already stored
            shape = graph.types[value].shape
            if shape != full_shape:  # one value per row
                phases.append(Phase(d.buffer_of[value], (), (), d.value(value, outer_index),
                                    flatten(outer_index, shape)))  # fmt: skip
                continue
            phases.append(_inner_row_phase(d, d.buffer_of[value], full_shape, axes, outer_index,
                                           lambda index, value=value: d.value(value, index)))  # fmt: skip
        loops = KernelLoops(d.buffers, phases, "row", row_shape, row_vars, d.tables)
    else:
        written: set[str] = set()
        for n in reductions:
            value = n.outputs[0]
            if value in kernel.outputs:  # computed straight into the output buffer, read from there if needed
                target = d.buffer_of[value]
                written.add(value)
            else:
                target = f"scr{sum(b.role == 'scratch' for b in d.buffers)}"
                d.buffers.append(Buffer(target, graph.types[value].dtype, graph.types[value].shape, "scratch"))
            phases.append(_merged_phase(d, target, graph.types[value].shape,
                                        lambda index, n=n: d.node_expr(n, 0, index)))  # fmt: skip
            d.materialized[value] = target
        for value in kernel.outputs:
            if value in written:
                continue
            phases.append(_merged_phase(d, d.buffer_of[value], graph.types[value].shape,
                                        lambda index, value=value: d.value(value, index)))  # fmt: skip
        loops = KernelLoops(d.buffers, phases, "phased", tables=d.tables)
    if sum(tree_size(p.expr) for p in phases) > MAX_TREE_NODES:
        raise NotGeneratable("inlined expression too large")
    return loops


def simplified(loops: KernelLoops) -> KernelLoops:
    """A constructed description with every index simplified, keeping the tables its phases still read."""
    phases = [_simplified(phase, loops) for phase in loops.phases]
    used: set[str] = set()
    for phase in phases:
        _tables_read(phase.expr, used)
    tables = {name: values for name, values in loops.tables.items() if name in used}  # not rebuilt ones
    return replace(loops, phases=phases, tables=tables)


def _tables_read(tree: Any, found: set[str]) -> None:
    if isinstance(tree, tuple) and tree:
        if tree[0] == "table":
            found.add(tree[1])
        for child in tree[1:]:
            _tables_read(child, found)


def _simplified(phase: Phase, loops: KernelLoops) -> Phase:
    """The phase with every index simplified against the extents of the loops around it."""
    ranges = dict(zip(phase.loop_vars, phase.loop_sizes, strict=True))
    if loops.schedule == "row":
        ranges.update({v: size for v, size in zip(loops.row_vars, loops.row_shape, strict=True)})
    return replace(phase, expr=simplify_indices(phase.expr, ranges), store_index=simplify(phase.store_index, ranges))


def _merged_phase(d: Describer, target: str, shape: tuple[int, ...], build: Any) -> Phase:
    """A phase over `shape`, with trailing axes merged into one loop where every access stays affine
    in the merged variable (long contiguous loops vectorize; 14-wide ones mostly do not)."""
    rank = len(shape)
    for merged in range(rank, 1, -1):
        sizes = tuple(shape[rank - merged:])
        loop_vars = tuple(f"l{j}" for j in range(rank - merged)) + ("m",)
        index = [("var", v) for v in loop_vars[:-1]] + [part("m", sizes, k) for k in range(merged)]
        counter = d.var_counter
        expr = build(index)
        if not has_parts(expr):
            loop_sizes = (*shape[: rank - merged], int(np.prod(sizes)))
            return Phase(target, loop_vars, loop_sizes, expr, flatten(index, shape))
        d.var_counter = counter
    loop_vars = tuple(f"l{j}" for j in range(rank))
    index = [("var", v) for v in loop_vars]
    counter = d.var_counter
    d.residue_hints = {}
    expr = build(index)
    factor = residue_factor(d.residue_hints.get(loop_vars[-1], set()), shape[-1], 2 * SHORT_INNER) if rank else None
    if factor is None:
        return Phase(target, loop_vars, shape, expr, flatten(index, shape))
    # an upsampling along the innermost axis: out[f·q + r] for each residue r is affine in q
    d.var_counter = counter
    residue = f"{loop_vars[-1]}r"
    d.residue_split = (loop_vars[-1], residue, factor)
    index[-1] = add(mul(index[-1], lit(factor)), ("var", residue))
    try:
        expr = build(index)
    finally:
        d.residue_split = None
    return Phase(target, (*loop_vars, residue), (*shape[:-1], shape[-1] // factor, factor), expr,
                 flatten(index, shape), residues=True)  # fmt: skip


def _inner_row_phase(d: Describer, target: str, shape: tuple[int, ...], axes: tuple[int, ...],
                     outer_index: list[Tree], build: Any) -> Phase:  # fmt: skip
    """The per-row loops over the reduced axes; contiguous reduced axes become one merged loop."""
    contiguous = list(axes) == list(range(axes[0], axes[0] + len(axes)))
    if contiguous and len(axes) > 1:
        sizes = tuple(shape[a] for a in axes)
        index = list(outer_index)
        for k, a in enumerate(axes):
            index[a] = part("ir", sizes, k)
        counter = d.var_counter
        expr = build(index)
        if not has_parts(expr):
            return Phase(target, ("ir",), (int(np.prod(sizes)),), expr, flatten(index, shape))
        d.var_counter = counter
    index = list(outer_index)
    for a in axes:
        index[a] = ("var", f"i{a}")
    return Phase(target, tuple(f"i{a}" for a in axes), tuple(shape[a] for a in axes), build(index),
                 flatten(index, shape))  # fmt: skip
