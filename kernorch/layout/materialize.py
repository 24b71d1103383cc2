"""Rewrite the graph so that every value is stored in its assigned layout.

A value v assigned layout p becomes the tensor transpose(v, p) under the same name (its type permuted);
each primitive is re-emitted in its chosen mode with its attributes remapped (modes.py); a consumer that
needs another layout gets an explicit transpose (one per value and layout, shared); constants are permuted
at compile time; graph inputs and outputs keep their names, shapes and row-major layout. After this, no
stage needs to know about layouts: a channels-last conv is a conv primitive with `channels_last`, and a
remaining transpose is a layout primitive the orchestrator fuses like any other.
"""

from __future__ import annotations

import numpy as np

from kernorch.ir.graph import Graph, Node, freeze_attrs, verify
from kernorch.ir.primitives import PRIMITIVES
from kernorch.ir.strided import swap_last_two
from kernorch.ir.types import TensorType
from kernorch.layout.assign import Assignment
from kernorch.layout.layouts import Perm, between, broadcast_operand, canonical, channels_last, identity, permute
from kernorch.layout.modes import Mode, is_identity_memory, relabel_attrs, transpose_materialized


class _Rewriter:
    def __init__(self, graph: Graph, assignment: Assignment) -> None:
        self.old = graph
        self.assignment = assignment
        self.new = Graph(inputs=list(graph.inputs), outputs=list(graph.outputs), name=graph.name)
        self.new.types = {v: graph.types[v] for v in graph.inputs}
        self.stored: dict[tuple[str, Perm], str] = {}  # (value, canonical layout) -> name in the new graph
        self.reshapes: dict[tuple[str, tuple[int, ...]], str] = {}  # (name, shape) -> the same memory reshaped
        for value in graph.inputs:
            self.stored[value, identity(graph.types[value].rank)] = value
        self.counter = 0

    def layout(self, value: str) -> Perm:
        return self.assignment.layouts.get(value, identity(self.old.types[value].rank))

    def fresh(self, hint: str) -> str:
        while True:
            self.counter += 1
            name = f"{hint}/layout_{self.counter}"
            if name not in self.old.types and name not in self.new.types:
                return name

    def emit(self, prim: str, inputs: list[str], attrs: dict[str, object], outputs: list[str], origin: str) -> None:
        frozen = freeze_attrs(attrs)
        inferred = PRIMITIVES[prim].infer([self.new.types[v] for v in inputs], dict(frozen))
        for name, value_type in zip(outputs, inferred, strict=True):
            self.new.types[name] = value_type
        self.new.nodes.append(Node(prim, tuple(inputs), tuple(outputs), frozen, origin))

    def constant(self, value: str, layout: Perm) -> str:
        key = (value, layout)
        if key not in self.stored:
            array = np.asarray(np.transpose(self.old.constants[value], layout), order="C")
            name = value if layout == identity(array.ndim) else self.fresh(value)
            self.new.constants[name] = array
            self.new.types[name] = TensorType.of(array)
            self.stored[key] = name
        return self.stored[key]

    def get(self, value: str, layout: Perm, origin: str) -> str:
        """`value` stored in `layout` (exactly: shaped permute(shape, layout)) in the new graph. A change of
        memory order is a transpose, inserted once per value and layout; a change of where size-1 axes sit
        is a reshape (free)."""
        if value in self.old.constants:
            return self.constant(value, layout)
        shape = self.old.types[value].shape
        memory = canonical(layout, shape)
        if (value, memory) not in self.stored:
            source = self.layout(value)
            # a node running in a frame stores its outputs with size-1 axes where its frame puts them: view the
            # value in its canonical shape first (free), which is what the transpose's permutation refers to
            canonical_view = self.reshaped(self.stored[value, source], permute(shape, source), origin)
            name = self.fresh(value)
            self.emit("transpose", [canonical_view], {"perm": between(source, memory)}, [name], origin)
            self.stored[value, memory] = name
        return self.reshaped(self.stored[value, memory], permute(shape, layout), origin)

    def reshaped(self, name: str, shape: tuple[int, ...], origin: str) -> str:
        if self.new.types[name].shape == shape:
            return name
        key = (name, shape)
        if key not in self.reshapes:
            reshaped = self.fresh(name)
            if name in self.new.constants:
                self.new.constants[reshaped] = self.new.constants[name].reshape(shape)
                self.new.types[reshaped] = TensorType.of(self.new.constants[reshaped])
            else:
                self.emit("reshape", [name], {"shape": shape}, [reshaped], origin)
            self.reshapes[key] = reshaped
        return self.reshapes[key]

    def node(self, index: int, node: Node) -> None:
        mode = self.assignment.modes[index]
        origin = node.origin
        out_type = self.old.types[node.outputs[0]]
        if node.prim == "matmul":
            self.matmul(node, mode)
            return
        if mode.as_matmul:
            self.pointwise_conv(node, mode)
            return
        if mode.channels_last:  # the activation exactly [N, *spatial, C] (even with C = 1); the weights (and
            x, *operands = node.inputs  # conv_integer's scalar zero points) as they are
            inputs = [self.get(x, channels_last(self.old.types[x].rank), origin),
                      *(self.get(v, identity(self.old.types[v].rank), origin) for v in operands)]  # fmt: skip
        elif mode.frame is not None:  # every operand viewed in the node's frame; lower ranks padded with 1s in front
            inputs = []
            for value in node.inputs:
                rank = self.old.types[value].rank
                name = self.get(value, broadcast_operand(mode.frame, rank), origin)
                if rank < out_type.rank:
                    padded = (1,) * (out_type.rank - rank) + self.old.types[value].shape
                    name = self.reshaped(name, permute(padded, mode.frame), origin)
                inputs.append(name)
        else:
            inputs = [self.get(v, layout, origin) for v, layout in zip(node.inputs, mode.inputs, strict=True)]
        moved = None
        if node.prim == "transpose":
            moved = transpose_materialized(node, self.old, mode.inputs[0], mode.outputs[0])
            if is_identity_memory(moved, self.new.types[inputs[0]].shape):
                # the layout absorbed the transpose: its output is the input's memory, relabelled
                self.stored[node.outputs[0], mode.outputs[0]] = self.reshaped(
                    inputs[0], permute(out_type.shape, mode.outputs[0]), origin)
                return
        self.emit(node.prim, inputs, relabel_attrs(self.old, node, mode, moved), list(node.outputs), origin)
        for value, layout in zip(node.outputs, mode.outputs, strict=True):
            self.stored[value, layout] = value

    def matmul(self, node: Node, mode: Mode) -> None:
        """A @ B with each operand read as it is stored, and the product stored swapped as Bᵀ @ Aᵀ when its
        mode says so. An operand read the other way than it is stored is a swap of its last two axes, which
        the library call reads through strides (a constant is permuted instead)."""
        a, b = node.inputs
        out = node.outputs[0]
        product_swapped = mode.outputs[0] != identity(len(mode.outputs[0]))

        def operand(value: str, layout: Perm, transposed: bool) -> str:
            rank = self.old.types[value].rank
            if value in self.old.constants:
                return self.constant(value, swap_last_two(rank) if transposed else identity(rank))
            name = self.get(value, layout, node.origin)
            if (layout != identity(rank)) == transposed:
                return name  # stored as the product reads it
            view = self.fresh(value)
            self.emit("transpose", [name], {"perm": swap_last_two(rank)}, [view], node.origin)
            return view

        la, lb = mode.inputs
        if product_swapped:
            inputs = [operand(b, lb, True), operand(a, la, True)]
        else:
            inputs = [operand(a, la, False), operand(b, lb, False)]
        self.emit("matmul", inputs, node.attr_dict, [out], node.origin)
        self.stored[out, mode.outputs[0]] = out

    def pointwise_conv(self, node: Node, mode: Mode) -> None:
        """A 1x1 conv as a matmul over the channel axis: W [O, C] @ x [N, C, pixels] when its output is
        NCHW, x [N, pixels, C] @ Wᵀ when channels-last; x is read through a swap (strides) when it is
        stored the other way."""
        x, weight = node.inputs
        x_shape, out_shape = self.old.types[x].shape, self.old.types[node.outputs[0]].shape
        n, channels, pixels = x_shape[0], x_shape[1], int(np.prod(x_shape[2:]))
        matrix = self.old.constants[weight].reshape(out_shape[1], channels)
        x_last = mode.inputs[0] != identity(len(x_shape))
        out_last = mode.outputs[0] != identity(len(out_shape))
        stored = self.get(x, mode.inputs[0], node.origin)
        flat = (n, pixels, channels) if x_last else (n, channels, pixels)
        operand = self.reshaped(stored, flat, node.origin)
        if x_last != out_last:  # read the other way round: a free swap for the library call
            view = self.fresh(x)
            self.emit("transpose", [operand], {"perm": (0, 2, 1)}, [view], node.origin)
            operand = view
        w = self.fresh(weight)
        self.new.constants[w] = np.asarray(matrix.T if out_last else matrix, order="C")
        self.new.types[w] = TensorType.of(self.new.constants[w])
        product = self.fresh(node.outputs[0])
        self.emit("matmul", [operand, w] if out_last else [w, operand], {}, [product], node.origin)
        self.emit("reshape", [product], {"shape": permute(out_shape, mode.outputs[0])}, list(node.outputs),
                  node.origin)  # fmt: skip
        self.stored[node.outputs[0], mode.outputs[0]] = node.outputs[0]

    def finish(self) -> Graph:
        renames: dict[str, str] = {}
        for value in self.old.outputs:
            name = self.get(value, identity(self.old.types[value].rank), "layout:output")
            if name != value:
                renames[value] = self.fresh(value)  # the permuted tensor gives up the output's name
                renames[name] = value
        if renames:
            def rename(value: str) -> str:
                return renames.get(value, value)

            self.new.nodes = [Node(n.prim, tuple(map(rename, n.inputs)), tuple(map(rename, n.outputs)), n.attrs,
                                   n.origin) for n in self.new.nodes]  # fmt: skip
            self.new.types = {rename(v): t for v, t in self.new.types.items()}
        verify(self.new)
        return self.new


def materialize(graph: Graph, assignment: Assignment) -> Graph:
    """A new graph with the assignment's layouts; computes exactly what `graph` computes."""
    rewriter = _Rewriter(graph, assignment)
    for index, node in enumerate(graph.nodes):
        rewriter.node(index, node)
    return rewriter.finish()
