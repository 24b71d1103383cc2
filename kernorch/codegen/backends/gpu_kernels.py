"""The GPU's backends: fused memory-intensive kernels rendered as Triton (`TRITON`), a matmul with its elementwise
epilogue as one Triton template (`TRITON_MATMUL`), a lone linear primitive through torch's cuBLAS/cuDNN calls
(`TORCH_LIBRARY`), and views (`GPU_VIEW`, a reshape or a contiguous slice: no code). They run on a GPU plan's
runtime (runtime/gpu_plan.py), never in the CPU plan program: `device = "gpu"`. A kernel none of them runs (an LSTM, an
ONNX node kernorch has no rule for) runs by the reference or onnxruntime on the host, which the cost model prices
with its copies, so plans avoid it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from kernorch.codegen.backends.base import Backend, Verdict, declines, runs
from kernorch.codegen.backends.fallbacks import View
from kernorch.codegen.gir import described, remembered
from kernorch.codegen.loops import NotGeneratable
from kernorch.codegen.target import GPU_TARGETS, Target
from kernorch.codegen.triton import TritonKernel, matmul_rejection, render_matmul, render_triton
from kernorch.ir.graph import Graph, Node
from kernorch.ir.kernel import CandidateKernel
from kernorch.ir.primitives import PRIMITIVES, Kind

TORCH_LINEAR_DTYPES = ("float32", "float64")


class GpuBackend(Backend):
    device = "gpu"
    native = False  # run by the GPU runtime's launches, not the CPU plan program

    def triton(self, name: str, kernel: CandidateKernel, target: Target, tf32: bool = False) -> TritonKernel | None:
        """The kernel as Triton functions prefixed by `name`, or None when it runs no Triton."""
        return None


class GpuView(View):
    """The CPU's view, but for a concat: the GPU runtime places no producer inside a concat's output."""

    name = "gpu_view"
    device = "gpu"

    def applies(self, kernel: CandidateKernel) -> Verdict:
        if kernel.primitives[0].prim == "concat":
            return declines("a concat is copied on a GPU (no producer writes into its output)")
        return super().applies(kernel)


class GeneratedTriton(GpuBackend):
    name = "triton"
    family = "generated Triton"
    signature_label = "triton"
    has_gir = True  # its loops lower to a GIR for the GPU Target (what its cost model reads)

    def applies(self, kernel: CandidateKernel) -> Verdict:
        linear = next((n for n in kernel.primitives if PRIMITIVES[n.prim].kind == Kind.LINEAR), None)
        try:
            rendered(kernel, _ANY_GPU)  # a depthwise conv is a window reduction here; other linear ones are not
        except NotGeneratable as error:
            return declines(str(error), claims=linear is None)
        return runs("generated Triton" if linear is None else "generated Triton (depthwise conv)")

    def triton(self, name: str, kernel: CandidateKernel, target: Target, tf32: bool = False) -> TritonKernel | None:
        if name == "k":
            return rendered(kernel, target)
        return render_triton(name, described(kernel), target)

    def signature_text(self, kernel: CandidateKernel) -> str:
        kernel_text = rendered(kernel, _ANY_GPU)
        return kernel_text.source + json.dumps([launch.programs for launch in kernel_text.launches])


def rendered(kernel: CandidateKernel, target: Target) -> TritonKernel:
    """The kernel as Triton named "k" (made once per kernel and target while a subgraph is priced)."""
    return remembered(("triton", target.name), kernel, lambda: render_triton("k", described(kernel), target))


class TritonMatmul(GpuBackend):
    name = "triton_matmul"
    family = "Triton template"
    signature_label = "triton"

    def applies(self, kernel: CandidateKernel) -> Verdict:
        rejection = matmul_rejection(kernel)
        if rejection is not None:
            return declines(rejection)
        epilogue = len(kernel.nodes) - 1
        return runs("Triton matmul template" + (f" + {epilogue} fused epilogue primitive(s)" if epilogue else ""))

    def triton(self, name: str, kernel: CandidateKernel, target: Target, tf32: bool = False) -> TritonKernel | None:
        return render_matmul(name, kernel, target, tf32)


class TorchLibrary(GpuBackend):
    """One linear primitive through torch: cuBLAS for a matmul, cuDNN for a convolution (NHWC kernels when the
    layout stage made it channels-last)."""

    name = "torch_library"
    family = "library call"
    signature_label = "library"

    def applies(self, kernel: CandidateKernel) -> Verdict:
        if len(kernel.nodes) != 1:
            return declines("a library call here runs one linear primitive (its epilogue is a Triton kernel, or "
                            "fused in the Triton matmul template)", claims=False)  # fmt: skip
        node = kernel.primitives[0]
        if PRIMITIVES[node.prim].kind != Kind.LINEAR:
            return declines("no linear primitive")
        types = [kernel.graph.types[v] for v in (*node.inputs, *node.outputs)]
        if any(t.dtype not in TORCH_LINEAR_DTYPES for t in types) or len({t.dtype for t in types}) != 1:
            return declines(f"{node.prim} of {types[0].dtype}: torch's GPU library calls here take float32/float64",
                            claims=True)  # fmt: skip
        what = {"matmul": "cuBLAS matmul", "conv": "cuDNN convolution", "conv_transpose": "cuDNN deconvolution"}
        layout = " (channels-last)" if node.attr("channels_last", False) else ""
        return runs(f"{what[node.prim]} through torch{layout}")

    def torch_call(self, kernel: CandidateKernel, tf32: bool = False) -> Callable[[Sequence[Any], Any], None]:
        """f(operand tensors, output tensor): the primitive through torch, written into the output."""
        import torch

        node = kernel.primitives[0]
        if node.prim == "matmul":

            def matmul(operands: Sequence[Any], out: Any) -> None:
                torch.matmul(operands[0], operands[1], out=out)

            return matmul
        linear = torch_linear(node, kernel.graph)

        def conv(operands: Sequence[Any], out: Any) -> None:  # torch returns a new tensor: copied into the plan's
            out.copy_(linear(operands))

        return conv


def torch_linear(node: Node, graph: Graph) -> Callable[[Sequence[Any]], Any]:
    """f(operands) -> the result of a conv or conv_transpose primitive through torch (cuDNN), in the primitive's
    layout: a channels-last buffer is an NCHW tensor in channels_last memory format, which cuDNN runs as NHWC."""
    import torch.nn.functional as F  # noqa: N812 - torch's own name for it

    attrs = node.attr_dict
    last = bool(attrs.get("channels_last", False))
    spatial = graph.types[node.inputs[0]].rank - 2
    pads = list(attrs["pads"])
    symmetric = pads[:spatial] == pads[spatial:]
    pad_spec = [p for i in reversed(range(spatial)) for p in (pads[i], pads[spatial + i])]
    to_first = (0, spatial + 1, *range(1, spatial + 1))
    to_last = (0, *range(2, spatial + 2), 1)

    def linear(operands: Sequence[Any]) -> Any:
        x, w = operands
        if last:
            x = x.permute(*to_first)
        if node.prim == "conv":
            if not symmetric:
                x = F.pad(x, pad_spec)
            function = getattr(F, f"conv{spatial}d")
            y = function(x, w, None, tuple(attrs["strides"]), tuple(pads[:spatial]) if symmetric else 0,
                         tuple(attrs["dilations"]), attrs["group"])  # fmt: skip
        else:  # the unpadded result, cropped by the pads (torch pads a deconvolution symmetrically only)
            function = getattr(F, f"conv_transpose{spatial}d")
            y = function(x, w, None, tuple(attrs["strides"]), 0, tuple(attrs["output_padding"]), attrs["group"],
                         tuple(attrs["dilations"]))  # fmt: skip
            y = y[(slice(None), slice(None), *(slice(pads[i], y.shape[2 + i] - pads[spatial + i])
                                                for i in range(spatial)))]  # fmt: skip
        return y.permute(*to_last) if last else y

    return linear


_ANY_GPU = GPU_TARGETS["a100"]  # what a kernel's renderability and signature are checked against (any GPU would do)

GPU_VIEW = GpuView()
TRITON = GeneratedTriton()
TRITON_MATMUL = TritonMatmul()
TORCH_LIBRARY = TorchLibrary()
