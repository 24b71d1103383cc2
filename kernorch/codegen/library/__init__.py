"""Library calls: a linear primitive with what it absorbs as one call (call.py), the elementwise epilogues it
absorbs as post-ops (epilogue.py), rendered against oneDNN's C API (onednn.py), and post-ops as C statements for
the library-shaped kernels kernorch writes itself (post_ops.py)."""

from kernorch.codegen.library.call import LibraryCall, Tensor, absorbed_summary, describe_library_call
from kernorch.codegen.library.onednn import (
    ONEDNN_HEADER,
    ONEDNN_PRELUDE,
    converted_operands,
    library_implementation,
    onednn_rejection,
    onednn_root,
    render_onednn_call,
)
from kernorch.codegen.library.post_ops import (
    VECTOR_SELECT,
    binary_operands,
    post_op_loop,
    post_op_statements,
    post_ops_rejection,
    vector_epilogue,
    vector_operand,
    vector_post_op_statements,
)
from kernorch.codegen.library.run_sizes import (
    PER_SHAPE_PRIMITIVES,
    render_matmul_at_run_sizes,
    render_per_shape,
    runs_at_run_sizes,
)

__all__ = [
    "VECTOR_SELECT",
    "LibraryCall",
    "ONEDNN_HEADER",
    "ONEDNN_PRELUDE",
    "PER_SHAPE_PRIMITIVES",
    "Tensor",
    "absorbed_summary",
    "binary_operands",
    "converted_operands",
    "describe_library_call",
    "library_implementation",
    "onednn_rejection",
    "onednn_root",
    "post_op_loop",
    "post_op_statements",
    "post_ops_rejection",
    "vector_epilogue",
    "vector_operand",
    "vector_post_op_statements",
    "render_matmul_at_run_sizes",
    "render_onednn_call",
    "render_per_shape",
    "runs_at_run_sizes",
]
