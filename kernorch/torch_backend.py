"""`torch.compile(module, backend="kernorch")`: Dynamo hands over each captured FX graph; kernorch exports it
through torch.export to ONNX (frontend/torch_export.py), optimizes and compiles it, and returns a callable that
runs the plan on the graph's tensors.

A graph kernorch cannot take — an operator without a fission rule (the backend is strict: no onnxruntime
fallback inside torch.compile, eager PyTorch is the better fallback there), dynamic shapes, autograd, a failed
export — runs eagerly, and the reason is logged on the `kernorch.torch` logger.

The backend is found by name through the `torch_dynamo_backends` entry point, and `import kernorch` registers it
when torch is already loaded. Options come from `torch.compile(..., options={"cost": "analytic", ...})`
(the fields of `kernorch.Options`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from kernorch.api import compile as compile_model
from kernorch.errors import KernorchError
from kernorch.frontend.torch_export import export_to_onnx
from kernorch.options import Options

LOGGER = logging.getLogger("kernorch.torch")
BACKEND_NAME = "kernorch"


class EagerFallback(KernorchError):
    """This graph runs eagerly; the message says why."""


def kernorch_backend(graph_module: Any, example_inputs: Sequence[Any], options: dict[str, Any] | None = None,
                     **_: Any) -> Callable[..., Any]:  # fmt: skip
    """A Dynamo backend: the compiled plan as a callable, or the graph's own forward when kernorch cannot take it."""
    try:
        return _compile_graph(graph_module, example_inputs, options or {})
    except Exception as error:  # whatever goes wrong, the user's program still runs: eagerly, with the reason
        reason = str(error) if isinstance(error, KernorchError) else f"{type(error).__name__}: {error}"
        LOGGER.warning("kernorch runs this graph eagerly: %s", reason.strip().splitlines()[0] if reason else reason)
        return graph_module.forward  # type: ignore[no-any-return]


def _compile_graph(graph_module: Any, example_inputs: Sequence[Any], settings: dict[str, Any]) -> Callable[..., Any]:
    import torch
    from torch.utils import _pytree

    for position, value in enumerate(example_inputs):
        if not isinstance(value, torch.Tensor):
            raise EagerFallback(f"input {position} is a {type(value).__name__}, not a tensor (dynamic shapes are "
                                "not supported: compile with dynamic=False)")  # fmt: skip
        if value.requires_grad and torch.is_grad_enabled():
            raise EagerFallback("an input requires grad: kernorch compiles inference only (use torch.no_grad())")
        if value.device.type != "cpu":
            raise EagerFallback(f"input {position} is on {value.device}; kernorch runs on the CPU")
    with torch.no_grad():
        expected = graph_module(*example_inputs)
    expected_flat, structure = _pytree.tree_flatten(expected)
    options = Options(strict=True).with_(**settings)
    proto = export_to_onnx(graph_module, example_inputs)
    compiled = compile_model(proto, options=options)
    if len(compiled.output_names) != len(expected_flat) or len(compiled.input_names) != len(example_inputs):
        raise EagerFallback(f"the exported graph has {len(compiled.input_names)} inputs and "
                            f"{len(compiled.output_names)} outputs, Dynamo's {len(example_inputs)} and "
                            f"{len(expected_flat)}")  # fmt: skip
    input_names, output_names = compiled.input_names, compiled.output_names
    LOGGER.info("kernorch compiled a graph of %d primitives into %d kernels", len(compiled.graph.nodes),
                len(compiled.kernels))  # fmt: skip

    def run(*args: Any) -> Any:
        feeds = {name: arg.detach().contiguous().numpy() for name, arg in zip(input_names, args, strict=True)}
        outputs = compiled.run(feeds)
        return _pytree.tree_unflatten([torch.from_numpy(outputs[name]) for name in output_names], structure)

    run.compiled = compiled  # type: ignore[attr-defined]  # the plan, for inspection
    return run


def register() -> None:
    """Make `backend="kernorch"` known to torch.compile (the entry point does this too, lazily)."""
    from torch._dynamo.backends.registry import _BACKENDS, _COMPILER_FNS, register_backend

    # an entry point torch already found is being loaded by torch itself (which registers it next)
    if BACKEND_NAME not in _COMPILER_FNS and _BACKENDS.get(BACKEND_NAME) is None:
        register_backend(kernorch_backend, name=BACKEND_NAME)
