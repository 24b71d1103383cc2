"""`torch.compile(module, backend="kernorch")`: Dynamo hands over each captured FX graph; kernorch exports it
through torch.export to ONNX (frontend/torch_export.py), optimizes and compiles it, and returns a callable that
runs the plan on the graph's tensors.

A graph kernorch cannot take — an operator without a fission rule (the backend is strict: no onnxruntime
fallback inside torch.compile, eager PyTorch is the better fallback there), autograd, a failed export — runs
eagerly, and the reason is logged on the `kernorch.torch` logger.

Dynamic shapes (`dynamic=True`, or Dynamo's automatic dynamic shapes after a second size is seen): Dynamo hands
over a graph whose sizes are symbols, passed as int inputs. Its guards decide when that graph is reused (Dynamo
specialises sizes 0 and 1 and recompiles when a guard fails); within one graph the backend keeps a kernorch plan
per concrete signature — the tensors' shapes and the ints' values — exported and compiled on the first call with
it (logged), reused after (kernorch/shapes/Memo: concurrent first calls compile it once). A signature kernorch
cannot take runs eagerly, alone.

The backend is found by name through the `torch_dynamo_backends` entry point, and `import kernorch` registers it
when torch is already loaded. Options come from `torch.compile(..., options={"cost": "analytic", ...})`
(the fields of `kernorch.Options`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Sequence
from typing import Any

from kernorch.api import CompiledModel
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

    for position, value in enumerate(example_inputs):
        if isinstance(value, torch.Tensor) and value.device.type != "cpu":
            raise EagerFallback(f"input {position} is on {value.device}; kernorch runs on the CPU")
        if not isinstance(value, (torch.Tensor, int, torch.SymInt)):
            raise EagerFallback(f"input {position} is a {type(value).__name__}, not a tensor or a size")
    weights = _weight_positions(graph_module, example_inputs)
    if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in example_inputs):
        # the plan's outputs carry no autograd history: gradients would silently be missing
        raise EagerFallback("autograd is on and the graph has inputs or weights that require grad: kernorch "
                            "compiles inference only (call the model under torch.no_grad() or inference_mode())")
    if not _has_symbolic_sizes(graph_module, example_inputs):
        return _compile_static(graph_module, example_inputs, weights, settings)
    return _specialising(graph_module, weights, _module_scalars(graph_module, example_inputs, weights), settings)


def _has_symbolic_sizes(graph_module: Any, example_inputs: Sequence[Any]) -> bool:
    import torch

    if any(isinstance(v, (int, torch.SymInt)) and not isinstance(v, bool) for v in example_inputs):
        return True
    for node in graph_module.graph.nodes:
        value = node.meta.get("example_value") if node.op == "placeholder" else None
        if isinstance(value, torch.Tensor) and any(isinstance(d, torch.SymInt) for d in value.shape):
            return True
    return False


def _specialising(graph_module: Any, weights: set[int], scalars: set[int],
                  settings: dict[str, Any]) -> Callable[..., Any]:  # fmt: skip
    """The dynamic graph as a callable that compiles a plan per concrete call signature (module doc)."""
    import torch

    from kernorch.shapes import Memo

    plans: Memo[tuple[Any, ...], Callable[..., Any]] = Memo()

    def specialise(args: Sequence[Any], signature: tuple[Any, ...]) -> Callable[..., Any]:
        LOGGER.info("kernorch specialises a dynamic-shape graph for %s (its first call with these shapes)",
                    signature)  # fmt: skip
        try:
            return _compile_static(graph_module, args, weights, settings, scalars)
        except Exception as error:  # noqa: BLE001 - this signature runs eagerly; the others are unaffected
            reason = str(error) if isinstance(error, KernorchError) else f"{type(error).__name__}: {error}"
            LOGGER.warning("kernorch runs this graph eagerly for %s: %s", signature, reason.strip().splitlines()[0])
            return graph_module.forward  # type: ignore[no-any-return]

    def run(*args: Any) -> Any:
        signature = tuple(a.item() if i in scalars else tuple(a.shape) if isinstance(a, torch.Tensor) else int(a)
                          for i, a in enumerate(args) if i not in weights)  # fmt: skip
        return plans.get(signature, lambda: specialise(args, signature))(*args)

    run.plans = plans  # type: ignore[attr-defined]  # the plans by signature, for inspection
    return run


def _compile_static(graph_module: Any, example_inputs: Sequence[Any], weights: set[int], settings: dict[str, Any],
                    scalars: Collection[int] = ()) -> Callable[..., Any]:  # fmt: skip
    """One plan for the graph at the inputs' concrete shapes; int inputs (sizes) are bound as constants."""
    import torch
    from torch.utils import _pytree

    sizes: dict[int, Any] = {i: int(v) for i, v in enumerate(example_inputs) if not isinstance(v, torch.Tensor)}
    data = [i for i in range(len(example_inputs)) if i not in weights and i not in sizes and i not in scalars]
    with torch.no_grad():
        expected = graph_module(*example_inputs)
    if scalars:  # module attributes Dynamo passes as 0-d tensors under dynamic shapes (a LayerNorm's eps)
        graph_module = _bind_scalars(graph_module, {i: example_inputs[i].item() for i in scalars})
        sizes.update(dict.fromkeys(scalars, 0))  # the placeholder stays, unused: any value will do
    expected_flat, structure = _pytree.tree_flatten(expected)
    options = Options(strict=True).with_(**settings)
    # Dynamo lifts parameters and buffers to graph inputs; kernorch takes them as constants (folded, packed)
    frozen = _freeze_weights(graph_module, {i: example_inputs[i] for i in weights}, sizes, len(example_inputs))
    proto = export_to_onnx(frozen, [example_inputs[i] for i in data])
    compiled = compile_model(proto, options=options)
    if not isinstance(compiled, CompiledModel):
        raise EagerFallback("the export has symbolic dims")  # torch.export specialises: not expected
    if len(compiled.output_names) != len(expected_flat) or len(compiled.input_names) != len(data):
        raise EagerFallback(f"the exported graph has {len(compiled.input_names)} inputs and "
                            f"{len(compiled.output_names)} outputs, Dynamo's {len(data)} and "
                            f"{len(expected_flat)}")  # fmt: skip
    input_names, output_names = compiled.input_names, compiled.output_names
    versions = {i: (example_inputs[i], example_inputs[i]._version) for i in weights}
    LOGGER.info("kernorch compiled a graph of %d primitives into %d kernels (%d weights as constants)",
                len(compiled.graph.nodes), len(compiled.kernels), len(weights))  # fmt: skip
    stale: list[bool] = []

    def run(*args: Any) -> Any:
        if any(args[i] is not tensor or args[i]._version != version for i, (tensor, version) in versions.items()):
            if not stale:  # the plan holds the weights it was compiled with; changed weights run eagerly
                LOGGER.warning("kernorch runs this graph eagerly: its weights changed after compilation")
                stale.append(True)
            return graph_module(*args)
        feeds = {name: args[i].detach().contiguous().numpy() for name, i in zip(input_names, data, strict=True)}
        outputs = compiled.run(feeds)
        return _pytree.tree_unflatten([torch.from_numpy(outputs[name]) for name in output_names], structure)

    run.compiled = compiled  # type: ignore[attr-defined]  # the plan, for inspection
    return run


def _module_scalars(graph_module: Any, example_inputs: Sequence[Any], weights: set[int]) -> set[int]:
    """0-d tensors that are a module's attributes, not its parameters or buffers (Dynamo's unspecialised floats)."""
    import torch

    return {position for position, value in enumerate(example_inputs)
            if position not in weights and isinstance(value, torch.Tensor) and not value.ndim
            and any("NNModule" in kind for kind in _source_kinds(graph_module, position))}  # fmt: skip


def _weight_positions(graph_module: Any, example_inputs: Sequence[Any]) -> set[int]:
    """The inputs that are the module's parameters and buffers, which Dynamo lifts to graph inputs (a buffer's
    source descends from a parameter/buffer dictionary)."""
    import torch

    return {position for position, value in enumerate(example_inputs)
            if isinstance(value, torch.nn.Parameter)
            or "UnspecializedParamBufferSource" in _source_kinds(graph_module, position)}  # fmt: skip


def _source_kinds(graph_module: Any, position: int) -> list[str]:
    """The class names along the Dynamo source chain of placeholder `position` (where the value came from)."""
    placeholders = [n for n in graph_module.graph.nodes if n.op == "placeholder"]
    source = getattr(placeholders[position].meta.get("grapharg"), "source", None) \
        if position < len(placeholders) else None
    kinds = []
    while source is not None:
        kinds.append(type(source).__name__)
        source = getattr(source, "base", None)
    return kinds


def _freeze_weights(graph_module: Any, weights: dict[int, Any], sizes: dict[int, int], arity: int) -> Any:
    """The graph as a module taking only its data inputs, its weights bound as buffers (the export makes them
    initializers) and its size inputs as the ints of this specialisation."""
    import torch

    class FrozenWeights(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.graph_module = graph_module
            for position, tensor in weights.items():
                self.register_buffer(f"weight_{position}", tensor.detach())

        def forward(self, *inputs: Any) -> Any:
            supplied = iter(inputs)
            args = [getattr(self, f"weight_{i}") if i in weights else sizes[i] if i in sizes else next(supplied)
                    for i in range(arity)]  # fmt: skip
            return self.graph_module(*args)

    return FrozenWeights()


def _bind_scalars(graph_module: Any, values: dict[int, float]) -> Any:
    """A copy of the graph whose `.item()` of each scalar placeholder is its value (an export would otherwise
    see a data-dependent number); the placeholders stay, unused."""
    import copy

    module = copy.deepcopy(graph_module)
    placeholders = [n for n in module.graph.nodes if n.op == "placeholder"]
    for position, value in values.items():
        for user in list(placeholders[position].users):
            if user.op != "call_method" or user.target != "item":
                raise EagerFallback(f"a module scalar is used as a tensor ({user.target}), not as a number")
            for consumer in list(user.users):
                consumer.args = tuple(value if a is user else a for a in consumer.args)
                consumer.kwargs = {k: value if a is user else a for k, a in consumer.kwargs.items()}
            module.graph.erase_node(user)
    module.recompile()
    return module


def register() -> None:
    """Make `backend="kernorch"` known to torch.compile (the entry point does this too, lazily)."""
    from torch._dynamo.backends.registry import _BACKENDS, _COMPILER_FNS, register_backend

    # an entry point torch already found is being loaded by torch itself (which registers it next)
    if BACKEND_NAME not in _COMPILER_FNS and _BACKENDS.get(BACKEND_NAME) is None:
        register_backend(kernorch_backend, name=BACKEND_NAME)
