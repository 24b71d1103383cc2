"""Frontend: ONNX file or proto in, a checked model with static input types and constant tensors out."""

from kernorch.frontend.onnx_import import ImportedModel, import_model, parse_input_shapes

__all__ = ["ImportedModel", "import_model", "parse_input_shapes"]
