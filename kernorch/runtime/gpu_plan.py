"""Running a GPU plan: its Triton kernels and library calls on torch tensors, replayed as one CUDA graph.

- A static memory plan (runtime/memory.py) places every intermediate value in one device allocation; inputs and
  outputs have buffers of their own (a call copies its inputs in and its outputs out), views alias their source.
- Each kernel is one step: its Triton launches (codegen/triton/), a torch library call (cuBLAS/cuDNN), or, for a
  kernel no GPU backend runs, its reference or onnxruntime on the host with the copies both ways.
- On a GPU the steps are captured once as a CUDA graph and replayed per call. Kernels at the same depth of the
  plan's dependency graph (none reads another's output) are captured on separate streams, joined by events, so
  the graph may overlap them (Rammer's concurrent rTasks without per-kernel launches); with several streams,
  values get memory of their own (the memory plan's sharing assumes the plan's order).
- Without a GPU the same steps run in Triton's interpreter on CPU tensors (`interpret=True`: what
  `kernorch check --compiled --device a100` and the tests do); `kernorch run` refuses such a plan in one line.

Integer division by zero and gather indices out of range set a device flag the call checks after its run.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kernorch.codegen.backends import TorchLibrary, choose_backend
from kernorch.codegen.program import gpu_sources
from kernorch.codegen.target import GPU_TARGETS, Target
from kernorch.codegen.triton import TritonKernel, launch, load_module, use_interpreter_without_gpu
from kernorch.codegen.views import view_outputs
from kernorch.errors import KernorchError
from kernorch.ir.graph import Graph
from kernorch.ir.kernel import CandidateKernel
from kernorch.ir.primitives import run_primitive
from kernorch.runtime.feeds import ArrayModel
from kernorch.runtime.memory import plan_memory
from kernorch.runtime.reference import check_feeds

MAX_STREAMS = 4
_TORCH_DTYPES = {"float32": "float32", "float64": "float64", "int32": "int32", "int64": "int64", "bool": "uint8",
                 "float16": "float16", "int8": "int8", "uint8": "uint8", "int16": "int16",
                 "uint16": "uint16"}  # fmt: skip


class NoGpu(KernorchError):
    """A GPU plan asked to run on a machine without a CUDA device (outside the interpreter)."""


def device_preset() -> str:
    """The preset of the GPU present ("h100", "a100", "v100"); a newer or unknown GPU is priced as an H100."""
    import torch

    if not torch.cuda.is_available():
        raise NoGpu("--device cuda needs a CUDA device, and this machine has none (plan for one with "
                    "--device a100 --cost analytic)")  # fmt: skip
    name = torch.cuda.get_device_name().lower()
    return next((preset for preset in ("v100", "a100", "h100") if preset in name), "h100")


def _torch() -> Any:
    import torch

    return torch


@dataclass
class GpuProgram:
    """A GPU plan made runnable: buffers on the device, one step per kernel, a CUDA graph once captured."""

    graph: Graph
    kernels: list[CandidateKernel]
    target: Target
    tf32: bool = False
    cache_dir: Path | None = None
    interpret: bool = False  # run in Triton's interpreter on the CPU (no GPU here)
    streams: int = MAX_STREAMS
    steps: list[Callable[[], None]] = field(default_factory=list, init=False)
    host_steps: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        torch = _torch()
        if torch.cuda.is_available() and not self.interpret:
            self.device = torch.device("cuda")
        elif self.interpret:
            use_interpreter_without_gpu()  # refuses when Triton was imported for a GPU
            self.device = torch.device("cpu")
        else:
            raise NoGpu(f"this plan is for a GPU ({self.target.name}) and this machine has no CUDA device "
                        "(`kernorch check MODEL --compiled --device ...` runs it in Triton's interpreter)")  # fmt: skip
        source, rendered = gpu_sources(self.kernels, self.target, self.tf32)
        self.source = source
        self.module = load_module(source, self.cache_dir)
        self.lock = threading.Lock()  # one call at a time: the buffers and the graph are the program's
        self._allocate(rendered)
        self.cuda_graph: Any = None

    # ---- buffers
    def _tensor(self, dtype: str, shape: tuple[int, ...]) -> Any:
        torch = _torch()
        return torch.empty(shape, dtype=getattr(torch, _TORCH_DTYPES[dtype]), device=self.device)

    def _allocate(self, rendered: list[TritonKernel | None]) -> None:
        torch = _torch()
        graph = self.graph
        aliases: dict[str, str] = {}
        offsets: dict[str, int] = {}
        self.copied_views: dict[str, tuple[str, int]] = {}
        for kernel in self.kernels:
            backend, _ = choose_backend(kernel, "gpu")
            if backend is not None and not backend.runs_code:
                for value, (source, offset) in (view_outputs(kernel) or {}).items():
                    if value in graph.outputs or source in graph.outputs:
                        # an output has a buffer of its own (a call copies it out): the view is a copy there
                        self.copied_views[value] = (source, offset)
                    else:
                        aliases[value], offsets[value] = source, offset
        self.concurrent = self.device.type == "cuda" and self.streams > 1
        memory = plan_memory(graph, self.kernels, aliases)
        placements = dict(memory.placements)
        if self.concurrent:  # kernels on several streams: no two values share bytes
            position = 0
            for value, placement in sorted(placements.items()):
                placements[value] = type(placement)(position, placement.nbytes, placement.first, placement.last)
                position += placement.nbytes
        arena_bytes = max((p.offset + p.nbytes for p in placements.values()), default=0)
        self.arena = torch.empty(max(arena_bytes, 1), dtype=torch.uint8, device=self.device)
        tensors: dict[str, Any] = {}
        for name, array in graph.constants.items():
            stored = array.view(np.uint8) if array.dtype == np.bool_ else array
            tensors[name] = torch.from_numpy(np.array(stored)).to(self.device)
        for name in (*graph.inputs, *graph.outputs):
            if name not in tensors:
                t = graph.types[name]
                tensors[name] = self._tensor(t.dtype, t.shape)
        for value, placement in placements.items():
            t = graph.types[value]
            raw = self.arena[placement.offset: placement.offset + t.nbytes]
            tensors[value] = raw.view(getattr(torch, _TORCH_DTYPES[t.dtype])).view(t.shape)
        for kernel in self.kernels:  # views, in plan order (a view of a view follows its source)
            for value in kernel.outputs:
                if value in aliases and value not in tensors:
                    source = tensors[aliases[value]].reshape(-1)
                    t = graph.types[value]
                    tensors[value] = source[offsets[value]: offsets[value] + t.numel].view(t.shape)
        for value in (v for kernel in self.kernels for v in kernel.outputs):
            if value not in tensors:  # not placed (a graph output written by a view of it, say)
                t = graph.types[value]
                tensors[value] = self._tensor(t.dtype, t.shape)
        self.tensors = tensors
        self.error = torch.zeros(1, dtype=torch.int32, device=self.device)
        self.steps = [self._step(kernel, triton) for kernel, triton in zip(self.kernels, rendered, strict=True)]

    def _step(self, kernel: CandidateKernel, triton: TritonKernel | None) -> Callable[[], None]:
        torch = _torch()
        backend, _ = choose_backend(kernel, "gpu")
        assert backend is not None
        inputs = [self.tensors[v] for v in kernel.inputs]
        outputs = [self.tensors[v] for v in kernel.outputs]
        if not backend.runs_code:
            copies = [(self.tensors[v], self.tensors[self.copied_views[v][0]].reshape(-1), self.copied_views[v][1])
                      for v in kernel.outputs if v in self.copied_views]  # fmt: skip

            def view() -> None:  # nothing runs, but for a view into or out of a graph output: a copy
                for target, source, offset in copies:
                    target.copy_(source[offset: offset + target.numel()].view(target.shape))

            return view
        if triton is not None:
            buffers = [*inputs, *outputs]
            scratch = [self._tensor(b.dtype, b.shape) for b in triton.buffers if b.role == "scratch"]
            tables = [torch.from_numpy(np.array(v)).to(self.device) for v in triton.tables.values()]
            module, error = self.module, self.error
            ordered = [*buffers, *scratch]
            return lambda: launch(module, triton, ordered, tables, error)
        if isinstance(backend, TorchLibrary):
            call = backend.torch_call(kernel, self.tf32)
            return lambda: call(inputs, outputs[0])
        self.host_steps += 1
        graph = kernel.graph
        nodes = [graph.nodes[i] for i in kernel.nodes]

        def on_host() -> None:  # the reference (or onnxruntime) on copies: what no GPU backend runs
            local = {v: _to_numpy(t, graph.types[v].dtype) for v, t in zip(kernel.inputs, inputs, strict=True)}
            for node in nodes:
                local.update(zip(node.outputs, run_primitive(node.prim, [local[v] for v in node.inputs],
                                                             node.attr_dict), strict=True))  # fmt: skip
            for value, tensor in zip(kernel.outputs, outputs, strict=True):
                array = local[value].view(np.uint8) if local[value].dtype == np.bool_ else local[value]
                tensor.copy_(torch.from_numpy(np.asarray(array, order="C")))

        return on_host

    # ---- running
    def _dependencies(self) -> list[list[int]]:
        """Per kernel, the kernels whose outputs it reads: each value's latest producer before it (a plan may
        compute a value again later, Korch's recomputation)."""
        latest: dict[str, int] = {}
        dependencies = []
        for k, kernel in enumerate(self.kernels):
            dependencies.append(sorted({latest[v] for v in kernel.inputs if v in latest}))
            latest.update((v, k) for v in kernel.outputs)
        return dependencies

    def _levels(self) -> list[int]:
        """Per kernel, its depth in the plan's dependency graph (kernels of one depth are independent)."""
        levels: list[int] = []
        for dependencies in self._dependencies():
            levels.append(1 + max((levels[p] for p in dependencies), default=-1))
        return levels

    def _capture(self) -> Any:
        """The steps as one CUDA graph, independent kernels on separate streams."""
        torch = _torch()
        levels, dependencies = self._levels(), self._dependencies()
        seen: dict[int, int] = {}
        lanes = []
        for level in levels:
            lanes.append(seen.get(level, 0) % self.streams)
            seen[level] = seen.get(level, 0) + 1
        side = [torch.cuda.Stream() for _ in range(self.streams - 1)]
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            origin = torch.cuda.current_stream()
            start = torch.cuda.Event()
            start.record(origin)
            streams = [origin, *side]
            done: dict[int, Any] = {}
            last: dict[int, Any] = {}
            for k, step in enumerate(self.steps):
                stream = streams[lanes[k]]
                if lanes[k] and lanes[k] not in last:
                    stream.wait_event(start)
                for producer in dependencies[k]:
                    if lanes[producer] != lanes[k]:
                        stream.wait_event(done[producer])
                with torch.cuda.stream(stream):
                    step()
                event = torch.cuda.Event()
                event.record(stream)
                done[k] = last[lanes[k]] = event
            for lane, event in last.items():
                if lane:
                    origin.wait_event(event)
        return graph

    def __call__(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        torch = _torch()
        checked = check_feeds(self.graph, feeds)
        with self.lock:
            for name, array in checked.items():
                stored = array.view(np.uint8) if array.dtype == np.bool_ else array
                self.tensors[name].copy_(torch.from_numpy(np.asarray(stored, order="C")))
            self._run()
            self.check_errors()
            return {name: _to_numpy(self.tensors[name], self.graph.types[name].dtype) for name in self.graph.outputs}

    def run_on_device(self, inputs: Mapping[str, Any]) -> list[Any]:
        """One call on tensors already on the device: copied into the plan's input buffers (device to device), the
        graph replayed, the plan's own output buffers returned (valid until the next call; nothing synchronises
        or checks the error flag: `check_errors` does)."""
        with self.lock:
            for name, tensor in inputs.items():
                self.tensors[name].copy_(tensor)
            self._run()
            return [self.tensors[name] for name in self.graph.outputs]

    def _run(self) -> None:
        self.error.zero_()
        with _math_mode(self.tf32):
            self._steps_or_graph()

    def _steps_or_graph(self) -> None:
        torch = _torch()
        if self.device.type == "cuda" and self.host_steps == 0:
            if self.cuda_graph is None:
                for step in self.steps:  # a warm-up outside the graph: compiles every kernel, sizes workspaces
                    step()
                torch.cuda.synchronize()
                self.cuda_graph = self._capture()
            self.cuda_graph.replay()
        else:
            for step in self.steps:
                step()

    def run_steps(self) -> None:
        """The steps once, launch by launch (no graph): what profiling times with CUDA events."""
        with _math_mode(self.tf32):
            for step in self.steps:
                step()

    def check_errors(self) -> None:
        if int(self.error.item()):
            raise KernorchError("an integer division by zero or an index out of range in a GPU kernel "
                                "(onnxruntime refuses such input too)")  # fmt: skip


@contextmanager
def _math_mode(tf32: bool) -> Iterator[None]:
    """cuBLAS and cuDNN in the plan's precision while its steps run (and are captured): TF32 only when the plan
    allows it (torch lets cuDNN use TF32 by default), the caller's settings restored after."""
    torch = _torch()
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tf32
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn


def _to_numpy(tensor: Any, dtype: str) -> np.ndarray:
    array = tensor.detach().cpu().numpy().copy()
    return array.view(np.bool_) if dtype == "bool" else array


def interpreting() -> bool:
    """Whether GPU plans run in Triton's interpreter in this process (no CUDA device)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


@dataclass
class GpuModel(ArrayModel):
    """A compiled GPU plan: callable like a CompiledModel (numpy arrays or torch tensors in, the same kind out)."""

    graph: Graph
    kernels: list[CandidateKernel]
    costs: list[float]
    device: str  # the preset it was planned for: "v100", "a100", "h100"
    metadata: dict[str, Any] = field(default_factory=dict)
    cache_dir: Path | None = None
    tf32: bool = False
    interpret: bool = False
    threads: int = 1  # (a saved plan's field; the GPU's parallelism is the plan's)

    def __post_init__(self) -> None:
        if self.device not in GPU_TARGETS:
            raise KernorchError(f"unknown GPU '{self.device}' (choose {', '.join(GPU_TARGETS)})")
        self.metadata = {**self.metadata, "device": self.device, "tf32": self.tf32}
        self._program: GpuProgram | None = None
        self._lock = threading.Lock()

    @property
    def target(self) -> Target:
        return GPU_TARGETS[self.device]

    @property
    def program(self) -> GpuProgram:
        """Made on first use: a plan saved or explained here needs no GPU (and no interpreter)."""
        with self._lock:
            if self._program is None:
                self._program = GpuProgram(self.graph, self.kernels, self.target, self.tf32, self.cache_dir,
                                           self.interpret)  # fmt: skip
            return self._program

    def source(self) -> str:
        """The plan's Triton module (what is saved as kernels.py and verified at load)."""
        return gpu_sources(self.kernels, self.target, self.tf32)[0]

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.program(feeds)

    def save(self, directory: str | os.PathLike[str]) -> Path:
        from kernorch.runtime.artifact import save_plan

        return save_plan(self, Path(directory))
