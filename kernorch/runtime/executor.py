"""Execute a plan: buffers allocated once, one launcher per kernel, generated C called through ctypes."""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from kernorch.codegen.backends import choose_backend, render_c
from kernorch.codegen.c_renderer import PRELUDE
from kernorch.codegen.compiler import compile_source, load_library
from kernorch.errors import KernorchError
from kernorch.ir import reference_kernels as K
from kernorch.ir.graph import Graph
from kernorch.ir.kernel import CandidateKernel
from kernorch.ir.primitives import run_primitive
from kernorch.runtime.reference import check_feeds
from kernorch.runtime.threads import thread_count

Launcher = Callable[[], None]


class KernelFailed(KernorchError):
    """A generated kernel reported an out-of-range gather index at run time."""


def generate_source(kernels: list[CandidateKernel]) -> tuple[str, dict[int, str]]:
    """One translation unit holding every C kernel of the plan; returns (source, kernel index -> symbol)."""
    parts = [PRELUDE]
    symbols: dict[int, str] = {}
    for i, kernel in enumerate(kernels):
        if choose_backend(kernel)[0] == "c":
            symbols[i] = f"kernel_{i}"
            parts.append(render_c(symbols[i], kernel))
    return "\n".join(parts), symbols


class PlanExecutor:
    def __init__(self, graph: Graph, kernels: list[CandidateKernel], threads: int = 2,
                 cache_dir: Path | None = None) -> None:  # fmt: skip
        self.graph = graph
        self.kernels = kernels
        self.threads = threads
        # Constants are copied once: contiguous, writable (torch views need that), owned by the executor.
        self.buffers: dict[str, np.ndarray] = {n: np.array(a, order="C") for n, a in graph.constants.items()}
        for name in graph.inputs:
            t = graph.types[name]
            self.buffers[name] = np.empty(t.shape, dtype=t.dtype)
        for kernel in kernels:
            for name in kernel.outputs:
                if name not in self.buffers:
                    t = graph.types[name]
                    self.buffers[name] = np.empty(t.shape, dtype=t.dtype)
        self.source, symbols = generate_source(kernels)
        self.library_path = compile_source(self.source, cache_dir) if symbols else None
        self.library = load_library(self.library_path) if self.library_path else None
        self.launchers: list[Launcher] = []
        self.backends: list[str] = []
        for i, kernel in enumerate(kernels):
            backend, reason = choose_backend(kernel)
            if backend is None:
                raise KernorchError(f"no backend can run kernel {i} ({kernel.describe()}): {reason}")
            self.backends.append(backend)
            if backend == "c":
                self.launchers.append(self._c_launcher(symbols[i], kernel))
            elif backend == "library":
                self.launchers.append(self._library_launcher(kernel))
            else:
                self.launchers.append(self._reference_launcher(kernel))

    # ------------------------------------------------------------------------------------ launchers
    def _c_launcher(self, symbol: str, kernel: CandidateKernel) -> Launcher:
        assert self.library is not None
        function = getattr(self.library, symbol)
        function.restype = ctypes.c_int
        function.argtypes = [ctypes.c_void_p]
        pointers = [self.buffers[v].ctypes.data for v in (*kernel.inputs, *kernel.outputs)]
        args = (ctypes.c_void_p * max(len(pointers), 1))(*pointers)

        def launch() -> None:
            if function(args):
                raise KernelFailed(f"kernel {symbol}: gather index out of range")

        return launch

    def _tensor(self, name: str) -> torch.Tensor:
        return torch.from_numpy(self.buffers[name])

    def _library_launcher(self, kernel: CandidateKernel) -> Launcher:
        nodes = kernel.primitives
        linear = next(n for n in nodes if n.prim in ("matmul", "conv", "conv_transpose"))
        producers = {n.outputs[0]: n for n in nodes}
        bias_node = next((n for n in nodes if n.prim == "add"), None)
        out_name = bias_node.outputs[0] if bias_node else linear.outputs[0]
        out = self._tensor(out_name)
        bias = None
        if bias_node is not None:
            other = bias_node.inputs[1] if bias_node.inputs[0] == linear.outputs[0] else bias_node.inputs[0]
            bias = self._tensor(other)

        def operand(value: str) -> torch.Tensor:
            if value in producers and producers[value].prim == "transpose":
                return self._tensor(producers[value].inputs[0]).transpose(-1, -2)  # consumed through strides
            return self._tensor(value)

        if linear.prim == "matmul":
            a, b = operand(linear.inputs[0]), operand(linear.inputs[1])
            if bias is not None and b.dim() == 2 and a.dim() >= 2 and a.is_contiguous():
                # [..., M, K] @ [K, N] + bias[N] as one addmm on the flattened rows: the bias is part of the call
                a_rows = a.reshape(-1, a.shape[-1])
                out_rows = out.view(-1, out.shape[-1])
                bias_row = bias.reshape(-1)

                def run_addmm() -> None:
                    torch.addmm(bias_row, a_rows, b, out=out_rows)

                return run_addmm

            def run_matmul() -> None:
                torch.matmul(a, b, out=out)
                if bias is not None:
                    out.add_(bias)

            return run_matmul
        x, w = operand(linear.inputs[0]), operand(linear.inputs[1])
        attrs = linear.attr_dict
        spatial = x.dim() - 2
        if linear.prim == "conv":
            pads = attrs["pads"]
            symmetric = all(pads[i] == pads[spatial + i] for i in range(spatial))
            conv = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[spatial]
            pad_spec = [p for i in reversed(range(spatial)) for p in (pads[i], pads[spatial + i])]
            flat_bias = bias.reshape(-1) if bias is not None else None

            def run_conv() -> None:
                source = x if symmetric else F.pad(x, pad_spec)
                result = conv(source, w, flat_bias, attrs["strides"], tuple(pads[:spatial]) if symmetric else 0,
                              attrs["dilations"], attrs["group"])  # fmt: skip
                out.copy_(result)

            return run_conv
        x_name, w_name = linear.inputs

        def run_conv_transpose() -> None:
            result = K.conv_transpose(self.buffers[x_name], self.buffers[w_name], attrs["strides"], attrs["pads"],
                                      attrs["dilations"], attrs["group"], attrs["output_padding"])  # fmt: skip
            if bias is not None:
                result = result + bias.numpy()
            np.copyto(self.buffers[out_name], result)

        return run_conv_transpose

    def _reference_launcher(self, kernel: CandidateKernel) -> Launcher:
        (node,) = kernel.primitives
        inputs = [self.buffers[v] for v in node.inputs]
        targets = [self.buffers.get(o) for o in node.outputs]
        attrs = node.attr_dict

        def launch() -> None:
            for target, result in zip(targets, run_primitive(node.prim, inputs, attrs), strict=True):
                if target is not None:
                    np.copyto(target, result)

        return launch

    # ------------------------------------------------------------------------------------ running
    def __call__(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        for name, array in check_feeds(self.graph, feeds).items():
            np.copyto(self.buffers[name], array)
        with thread_count(self.threads):
            for launch in self.launchers:
                launch()
        return {name: self.buffers[name].copy() for name in self.graph.outputs}
