"""Load and check an ONNX model, bind every input to a static shape, collect its constants.

Static shapes are a requirement of kernel orchestration: a symbolic input dimension must be bound by
the user (`--input-shape NAME=1x3x224x224`), otherwise the import stops and names the dimension.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import numpy_helper

from kernorch.errors import InvalidModel, ShapeError, UnsupportedOperator
from kernorch.ir.types import SUPPORTED_DTYPES, TensorType


@dataclass
class ImportedModel:
    """An ONNX graph ready for fission: typed inputs, constant tensors and the default-domain opset."""

    proto: onnx.ModelProto
    input_types: dict[str, TensorType]
    constants: dict[str, np.ndarray]
    opset: int
    output_names: list[str] = field(default_factory=list)

    @property
    def graph(self) -> onnx.GraphProto:
        return self.proto.graph


def onnx_dtype_name(elem_type: int, what: str) -> str:
    try:
        name = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type)).name
    except (KeyError, TypeError, ValueError):
        try:
            name = onnx.TensorProto.DataType.Name(elem_type) if elem_type else "undefined"
        except ValueError:  # not a data type ONNX defines (a corrupt file)
            name = f"unknown ({elem_type})"
    if name not in SUPPORTED_DTYPES:
        raise UnsupportedOperator("<input>", what, f"dtype {name} is not supported")
    return name


def parse_input_shapes(specs: list[str] | None) -> dict[str, tuple[int, ...]]:
    """Parse `NAME=1x3x224x224` strings (the CLI's --input-shape) into a dict."""
    shapes: dict[str, tuple[int, ...]] = {}
    for spec in specs or []:
        name, sep, dims = spec.rpartition("=")
        try:
            if not sep or not name:
                raise ValueError
            shapes[name] = tuple(int(d) for d in dims.split("x")) if dims else ()
            if any(d < 0 for d in shapes[name]):
                raise ValueError
        except ValueError:
            raise ShapeError(f"bad --input-shape '{spec}': expected NAME=D1xD2x... with integer dims") from None
    return shapes


def _first_non_utf8(message: Any) -> str | None:
    """The first string field of a protobuf message that did not decode as UTF-8 (protobuf then returns
    bytes, which would reach dict keys, generated names and onnxruntime), as "field name", or None.
    Found by the fuzzer."""
    for descriptor, value in message.ListFields():
        values = value if descriptor.is_repeated else [value]
        if descriptor.type == descriptor.TYPE_STRING:
            if any(not isinstance(v, str) for v in values):
                return f"{descriptor.name} field"
        elif descriptor.type == descriptor.TYPE_MESSAGE:
            for item in values:
                found = _first_non_utf8(item)
                if found is not None:
                    return found
    return None


def load_proto(source: str | os.PathLike[str] | bytes | onnx.ModelProto) -> onnx.ModelProto:
    if isinstance(source, onnx.ModelProto):
        return source
    if isinstance(source, bytes):
        data, where = source, "<bytes>"
    else:
        path = Path(source)
        if not path.is_file():
            raise InvalidModel(f"model file not found: {path}")
        data, where = path.read_bytes(), str(path)
    if not data:
        raise InvalidModel(f"{where} is empty, not an ONNX model")
    try:
        proto = onnx.load_from_string(data)
    except (DecodeError, RuntimeError, ValueError) as error:
        raise InvalidModel(f"{where} is not a readable ONNX model (truncated or another format): {error}") from None
    if not proto.graph.node and not proto.graph.output:
        raise InvalidModel(f"{where} is not an ONNX model: no graph")
    bad = _first_non_utf8(proto)
    if bad is not None:
        raise InvalidModel(f"{where} has a {bad} that is not valid UTF-8 (ONNX strings are UTF-8)")
    if not isinstance(source, bytes) and proto.graph.initializer:
        base = str(Path(source).parent)  # type: ignore[arg-type]
        try:
            onnx.external_data_helper.load_external_data_for_model(proto, base)
        except (OSError, ValueError) as error:
            raise InvalidModel(f"{where}: cannot load external tensor data: {error}") from None
    return proto


def checked_proto(source: str | os.PathLike[str] | bytes | onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """The model, through the ONNX checker and kernorch's own checks, with its default-domain opset."""
    proto = load_proto(source)
    try:
        onnx.checker.check_model(proto)
    except onnx.checker.ValidationError as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else "invalid"
        raise InvalidModel(f"model fails the ONNX checker: {first_line}") from None
    except UnicodeDecodeError:  # protobuf strings are UTF-8 by spec; found by the fuzzer
        raise InvalidModel("model has a name or string that is not valid UTF-8") from None

    outputs = [o.name for o in proto.graph.output]
    repeated = sorted({name for name in outputs if outputs.count(name) > 1})
    if repeated:  # found by the fuzzer: the checker lets it through
        raise InvalidModel(f"graph output '{repeated[0]}' is listed more than once")
    opset = 0
    for entry in proto.opset_import:
        if entry.domain in ("", "ai.onnx"):
            opset = entry.version
    if not opset:
        raise InvalidModel("model imports no default-domain (ai.onnx) opset")

    return proto, opset


def import_model(
    source: str | os.PathLike[str] | bytes | onnx.ModelProto,
    input_shapes: Mapping[str, tuple[int, ...]] | None = None,
    constant_inputs: Mapping[str, np.ndarray] | None = None,
) -> ImportedModel:
    """Load, check and type an ONNX model.

    `constant_inputs` binds graph inputs to fixed values (they become constants): a static-shape
    compiler's way to receive, e.g., a Reshape target that a test model passes as an input.
    """
    proto, opset = checked_proto(source)
    constants: dict[str, np.ndarray] = {}
    for tensor in proto.graph.initializer:
        onnx_dtype_name(tensor.data_type, tensor.name)
        constants[tensor.name] = numpy_helper.to_array(tensor)
    for sparse in proto.graph.sparse_initializer:
        raise UnsupportedOperator("<initializer>", sparse.values.name, "sparse initializers are not supported")

    shapes = dict(input_shapes or {})
    bound = dict(constant_inputs or {})
    input_types: dict[str, TensorType] = {}
    declared = [i for i in proto.graph.input if i.name not in constants]
    known = {i.name for i in declared}
    for name in list(shapes) + list(bound):
        if name not in known:
            raise ShapeError(f"--input-shape names '{name}', but the model's inputs are {sorted(known)}")
    for value in declared:
        if not value.type.HasField("tensor_type"):
            raise UnsupportedOperator("<input>", value.name, "only tensor inputs are supported")
        tensor_type = value.type.tensor_type
        dtype = onnx_dtype_name(tensor_type.elem_type, value.name)
        if value.name in bound:
            constants[value.name] = np.asarray(bound[value.name]).astype(dtype, copy=False)
            continue
        if not tensor_type.HasField("shape"):
            if value.name not in shapes:
                raise ShapeError(f"input '{value.name}' has no shape; bind it with --input-shape {value.name}=...")
            input_types[value.name] = TensorType(shapes[value.name], dtype)
            continue
        declared_dims = tensor_type.shape.dim
        if value.name in shapes:
            shape = shapes[value.name]
            if len(shape) != len(declared_dims) or any(
                d.HasField("dim_value") and d.dim_value != s for d, s in zip(declared_dims, shape, strict=True)
            ):
                dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in declared_dims]
                raise ShapeError(f"--input-shape {value.name}={'x'.join(map(str, shape))} "
                                 f"contradicts the declared shape {dims}")  # fmt: skip
        else:
            for axis, dim in enumerate(declared_dims):
                if not dim.HasField("dim_value"):
                    label = dim.dim_param or "unnamed"
                    raise ShapeError(
                        f"input '{value.name}' has symbolic dim '{label}' (axis {axis}); "
                        f"bind it with --input-shape {value.name}=D1xD2x... (or, for `kernorch optimize` and "
                        "kernorch.compile, give several shapes or --dim sizes: a plan per shape)"
                    )
            shape = tuple(int(d.dim_value) for d in declared_dims)
        try:
            input_types[value.name] = TensorType(tuple(shape), dtype)
        except ValueError as error:  # beyond 2^40 elements: no size computed from it may wrap around
            raise ShapeError(f"input '{value.name}' of shape {'x'.join(map(str, shape))} is too large: "
                             f"{error}") from None  # fmt: skip

    return ImportedModel(
        proto=proto,
        input_types=input_types,
        constants=constants,
        opset=opset,
        output_names=[o.name for o in proto.graph.output],
    )
