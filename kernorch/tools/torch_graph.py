"""A primitive graph as torch operations: the PyTorch baseline of `kernorch bench --device cuda`.

The shared models are ONNX exports with random weights (running them in their torch architectures would need a
converter of those weights), and the ONNX-to-torch converters refuse most of them, so the baseline is the model's
primitive graph (as imported and fissioned, before kernorch's rewrites and fusion) run op by op in torch: cuBLAS
and cuDNN for the linear primitives, one torch kernel per elementwise, layout or reduction primitive — PyTorch
eager — and the same function under `torch.compile` (Inductor, which fuses it). A primitive with no torch
spelling here runs by its reference on the host (counted: `TorchGraph.host_nodes`; Inductor breaks its graph
there).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from kernorch.ir.graph import Graph, Node
from kernorch.ir.primitives import run_primitive

_UNARY = {"neg": "neg", "abs": "abs", "exp": "exp", "log": "log", "log1p": "log1p", "sqrt": "sqrt",
          "reciprocal": "reciprocal", "sin": "sin", "cos": "cos", "tanh": "tanh", "erf": "erf", "sigmoid": "sigmoid",
          "relu": "relu", "floor": "floor", "ceil": "ceil", "round": "round", "sign": "sign", "not": "logical_not",
          "identity": "clone"}  # fmt: skip
_BINARY = {"add": "add", "sub": "sub", "mul": "mul", "pow": "pow", "fmod": "fmod", "max": "maximum",
           "min": "minimum", "equal": "eq", "less": "lt", "greater": "gt", "less_equal": "le", "greater_equal": "ge",
           "and": "logical_and", "or": "logical_or", "xor": "logical_xor"}  # fmt: skip
_REDUCE = {"reduce_sum": "sum", "reduce_max": "amax", "reduce_min": "amin"}


class TorchGraph:
    """`graph` as a function of torch tensors on `device` (constants moved there once)."""

    def __init__(self, graph: Graph, device: Any) -> None:
        import torch

        self.graph, self.device = graph, device
        self.constants = {name: torch.from_numpy(np.array(array)).to(device)
                          for name, array in graph.constants.items()}  # fmt: skip
        self.steps = [self._step(node) for node in graph.nodes]
        self.host_nodes = sum(step is None for step in self.steps)

    def __call__(self, inputs: Mapping[str, Any]) -> list[Any]:
        values: dict[str, Any] = {**self.constants, **inputs}
        for node, step in zip(self.graph.nodes, self.steps, strict=True):
            operands = [values[v] for v in node.inputs]
            results = step(operands) if step is not None else self._on_host(node, operands)
            values.update(zip(node.outputs, results, strict=True))
        return [values[name] for name in self.graph.outputs]

    def _on_host(self, node: Node, operands: list[Any]) -> list[Any]:
        import torch

        arrays = [t.detach().cpu().numpy() for t in operands]
        return [torch.from_numpy(np.asarray(r, order="C")).to(self.device)
                for r in run_primitive(node.prim, arrays, node.attr_dict)]  # fmt: skip

    def _step(self, node: Node) -> Callable[[list[Any]], list[Any]] | None:
        import torch

        prim, attrs = node.prim, node.attr_dict
        out = self.graph.types[node.outputs[0]]
        if prim in _UNARY:
            function = getattr(torch, _UNARY[prim])
            return lambda x: [function(x[0])]
        if prim == "div":
            integer = out.dtype.startswith("int")
            return lambda x: [torch.div(x[0], x[1], rounding_mode="trunc" if integer else None)]
        if prim in _BINARY:
            function = getattr(torch, _BINARY[prim])
            return lambda x: [function(x[0], x[1])]
        if prim == "where":
            return lambda x: [torch.where(x[0], x[1], x[2])]
        if prim == "cast":
            dtype = getattr(torch, out.dtype)
            return lambda x: [x[0].to(dtype)]
        if prim in _REDUCE:
            function, axes = getattr(torch, _REDUCE[prim]), tuple(attrs["axes"])
            return lambda x: [function(x[0], dim=axes, keepdim=True)]
        if prim == "reshape" or prim == "expand":
            shape = out.shape
            return (lambda x: [x[0].reshape(shape)]) if prim == "reshape" else (lambda x: [x[0].expand(shape)])
        if prim == "transpose":
            perm = tuple(attrs["perm"])
            return lambda x: [x[0].permute(perm)]
        if prim == "slice" and all(step > 0 for _, _, step in attrs["ranges"]):
            index = tuple(slice(start, stop, step) for start, stop, step in attrs["ranges"])
            return lambda x: [x[0][index]]
        if prim == "concat":
            axis = attrs["axis"]
            return lambda x: [torch.cat(x, dim=axis)]
        if prim == "split":
            sizes, axis = list(attrs["sizes"]), attrs["axis"]
            return lambda x: list(torch.split(x[0], sizes, dim=axis))
        if prim == "gather":
            axis = attrs["axis"]
            size = self.graph.types[node.inputs[0]].shape[axis]

            def gather(x: list[Any]) -> list[Any]:
                indices = torch.where(x[1] < 0, x[1] + size, x[1])
                picked = torch.index_select(x[0], axis, indices.reshape(-1))
                return [picked.reshape(out.shape)]

            return gather
        if prim == "matmul":
            return lambda x: [torch.matmul(x[0], x[1])]
        if prim in ("conv", "conv_transpose"):
            from kernorch.codegen.backends import torch_linear

            linear = torch_linear(node, self.graph)
            return lambda x: [linear(x)]
        if prim == "pad":
            return _pad(attrs, self.graph.types[node.inputs[0]].rank)
        if prim in ("window_max", "window_sum"):
            return _window(prim, attrs, out.shape)
        if prim == "resize":
            return _resize(attrs, self.graph.types[node.inputs[0]].shape)
        return None


def _pad(attrs: Mapping[str, Any], rank: int) -> Callable[[list[Any]], list[Any]] | None:
    import torch.nn.functional as F  # noqa: N812

    pads, mode = list(attrs["pads"]), attrs["mode"]
    spec = [p for axis in reversed(range(rank)) for p in (pads[axis], pads[rank + axis])]
    if mode == "constant":
        value = float(attrs["value"])
        return lambda x: [F.pad(x[0], spec, value=value)]
    torch_mode = {"reflect": "reflect", "edge": "replicate", "wrap": "circular"}.get(mode)
    padded_axes = [axis for axis in range(rank) if pads[axis] or pads[rank + axis]]
    if torch_mode is None or not padded_axes or padded_axes[0] < rank - 3 or rank not in (3, 4, 5):
        return None  # torch pads these modes along the trailing (up to 3) axes of a batched tensor only
    trailing = rank - 2
    return lambda x: [F.pad(x[0], spec[: 2 * trailing], mode=torch_mode)]


def _window(prim: str, attrs: Mapping[str, Any], out_shape: tuple[int, ...]) -> Callable[[list[Any]], list[Any]]:
    import torch
    import torch.nn.functional as F  # noqa: N812

    kernel, strides, pads, dilations = attrs["kernel"], attrs["strides"], attrs["pads"], attrs["dilations"]
    spatial = len(kernel)

    def window(x: list[Any]) -> list[Any]:
        value = x[0]
        lead = value.ndim - spatial
        spans = [dilations[i] * (kernel[i] - 1) + 1 for i in range(spatial)]
        ends = [max((out_shape[lead + i] - 1) * strides[i] + spans[i] - value.shape[lead + i] - pads[i], 0)
                for i in range(spatial)]  # fmt: skip
        fill = float("-inf") if prim == "window_max" else 0.0
        spec = [p for i in reversed(range(spatial)) for p in (pads[i], ends[i])]
        value = F.pad(value, spec, value=fill)
        for i in range(spatial):
            value = value.unfold(lead + i, spans[i], strides[i])
        picked: tuple[Any, ...] = (..., *(slice(None, None, d) for d in dilations))
        value = value[picked]
        axes = tuple(range(-spatial, 0))
        return [torch.amax(value, dim=axes) if prim == "window_max" else torch.sum(value, dim=axes)]

    return window


def _resize(attrs: Mapping[str, Any], in_shape: tuple[int, ...]) -> Callable[[list[Any]], list[Any]] | None:
    import torch.nn.functional as F  # noqa: N812

    sizes = tuple(attrs["sizes"])
    if len(sizes) != 4 or sizes[:2] != tuple(in_shape[:2]):
        return None
    mode, coordinates = attrs["mode"], attrs["coordinate_mode"]
    if mode == "nearest" and coordinates == "asymmetric" and attrs["nearest_mode"] == "floor":
        return lambda x: [F.interpolate(x[0], size=sizes[2:], mode="nearest")]
    if mode == "linear" and coordinates in ("half_pixel", "pytorch_half_pixel", "align_corners"):
        corners = coordinates == "align_corners"
        return lambda x: [F.interpolate(x[0], size=sizes[2:], mode="bilinear", align_corners=corners)]
    return None
