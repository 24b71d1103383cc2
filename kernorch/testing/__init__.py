"""Helpers for tests, kernorch's and a user's: models.py builds one-operator and branchy ONNX models, draws inputs,
compiles for this CPU and compares with onnxruntime (re-exported here); rewrite.py builds primitive graphs for the
rewrite rules' tests; native.py checks the native kernels' tolerances and their C for every ISA."""

from kernorch.testing.models import (
    branchy_model,
    cpu_compile,
    dynamically_quantized_convolution,
    exact_int8_outputs,
    fission_and_compare,
    integer_extremes,
    keep_integer_convolutions,
    onnxruntime_saturates,
    primitive_names,
    random_array,
    single_op_model,
)

__all__ = ["branchy_model", "cpu_compile", "dynamically_quantized_convolution", "exact_int8_outputs",
           "fission_and_compare", "integer_extremes", "keep_integer_convolutions", "onnxruntime_saturates",
           "primitive_names", "random_array", "single_op_model"]  # fmt: skip
