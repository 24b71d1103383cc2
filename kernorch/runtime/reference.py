"""Reference interpreter: runs a primitive graph node by node with each primitive's reference code.

It is the executable specification of a primitive graph; compiled plans are checked against it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from kernorch.errors import InputMismatch, KernorchError
from kernorch.ir.graph import Graph
from kernorch.ir.primitives import run_primitive
from kernorch.ir.types import TensorType

_DTYPES: dict[str, np.dtype] = {}


def _native_dtype(name: str) -> np.dtype:
    """np.dtype(name), parsed once per name."""
    dtype = _DTYPES.get(name)
    if dtype is None:
        dtype = _DTYPES[name] = np.dtype(name)
    return dtype


def check_feeds(graph: Graph, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Validate run-time inputs against the graph's static input types (exit-2 errors on mismatch).

    Every input is checked whole: its dtype (kind, width and byte order), its shape. An array in the other byte
    order (e.g. `>f4` from a file written on a big-endian machine) is converted to this machine's order (one
    copy; the dtype's name alone would not tell, and the kernels would read swapped bytes). Strided and
    read-only arrays are accepted as they are: the kernels only read inputs, and the executor copies what it
    cannot read in place."""
    missing = [name for name in graph.inputs if name not in feeds]
    unknown = [name for name in feeds if name not in graph.inputs]
    if missing or unknown:
        raise InputMismatch(f"inputs do not match the model: missing {missing}, unexpected {unknown}")
    checked: dict[str, np.ndarray] = {}
    for name in graph.inputs:
        array = feeds[name]
        expected = graph.types[name]
        # the common case first, in two comparisons: a call's Python runs with caches the kernels just cooled,
        # where parsing a dtype name and building its byte-swapped twin cost ~30 µs (squeezenet: 5 % of a call)
        if type(array) is np.ndarray and array.dtype == _native_dtype(expected.dtype) and \
                array.shape == expected.shape:  # fmt: skip
            checked[name] = array  # equal to a native dtype: this byte order, this kind and width
            continue
        array = np.asarray(array)
        if array.dtype.names is not None or array.dtype.kind not in "biuf" or \
                array.dtype.newbyteorder("=") != np.dtype(expected.dtype):  # fmt: skip
            raise InputMismatch(f"input '{name}' has dtype {array.dtype.name} ({array.dtype.str}), the model "
                                f"expects {expected.dtype}")  # fmt: skip
        if tuple(array.shape) != expected.shape:
            raise InputMismatch(f"input '{name}' has shape {tuple(array.shape)}, the model expects {expected.shape}")
        if not array.dtype.isnative:
            array = array.astype(array.dtype.newbyteorder("="))
        checked[name] = array
    return checked


def run_reference(graph: Graph, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    values: dict[str, np.ndarray] = dict(graph.constants)
    values.update(check_feeds(graph, feeds))
    remaining_uses: dict[str, int] = {}
    for node in graph.nodes:
        for name in node.inputs:
            remaining_uses[name] = remaining_uses.get(name, 0) + 1
    keep = set(graph.outputs) | set(graph.constants)
    for node in graph.nodes:
        try:
            results = run_primitive(node.prim, [values[v] for v in node.inputs], node.attr_dict)
        except KernorchError as error:  # onnxruntime refusing a fallback node's data: say which node it was
            raise type(error)(f"{node.prim} from {node.origin}: {error}") from None
        for name, result in zip(node.outputs, results, strict=True):
            expected = graph.types[name]
            if TensorType.of(result) != expected:
                raise AssertionError(f"{node.prim} ({node.origin}) produced {TensorType.of(result)}, typed {expected}")
            values[name] = result
        # Free intermediates as soon as their last consumer ran: keeps big models within memory.
        for name in node.inputs:
            remaining_uses[name] -= 1
            if remaining_uses[name] == 0 and name not in keep:
                del values[name]
    return {name: values[name] for name in graph.outputs}


def run_plan_reference(graph: Graph, kernels: Sequence[Any], feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Execute a plan kernel by kernel with the reference primitives: each kernel sees only its inputs,
    keeps intermediates private and publishes only its outputs. Checks a plan's semantics (including
    redundant computation) without any code generation."""
    memory: dict[str, np.ndarray] = dict(graph.constants)
    memory.update(check_feeds(graph, feeds))
    for kernel in kernels:
        local = {name: memory[name] for name in kernel.inputs}
        for index in kernel.nodes:
            node = graph.nodes[index]
            results = run_primitive(node.prim, [local[v] for v in node.inputs], node.attr_dict)
            local.update(zip(node.outputs, results, strict=True))
        for name in kernel.outputs:
            memory[name] = local[name]
    return {name: memory[name] for name in graph.outputs}
