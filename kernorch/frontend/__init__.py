"""Frontend: ONNX file or proto in, a checked model with static input types and constant tensors out."""

from kernorch.frontend.onnx_import import ImportedModel, checked_proto, import_model, parse_input_shapes
from kernorch.frontend.signature import (
    InputSignature,
    ShapeSet,
    bind,
    describe_shapes,
    input_signature,
    is_dynamic,
    parse_dim_buckets,
    parse_shape_sets,
    shape_set,
    shapes_for,
    symbols_of,
)

__all__ = [
    "ImportedModel",
    "checked_proto",
    "InputSignature",
    "ShapeSet",
    "bind",
    "describe_shapes",
    "import_model",
    "input_signature",
    "is_dynamic",
    "parse_dim_buckets",
    "parse_input_shapes",
    "parse_shape_sets",
    "shape_set",
    "shapes_for",
    "symbols_of",
]
