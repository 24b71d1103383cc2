"""GIR: memory-intensive kernels as graphs of computation and explicit data movement (PowerFusion §4-§5).

`graph.py` holds the IR, `lowering.py` builds it from a kernel's loop description, making the choices of how it
runs with the passes beside it (sharing, tiling, interchanged and split reductions, tee, one-pass variance, row
permutation), and `rules.py` rewrites it. `memo.py` makes a candidate's description and GIR once while a
subgraph is priced. No language here: codegen/c/ renders the GIR as C; cost/gir_model.py prices it.
"""

from kernorch.codegen.gir.graph import (
    CACHE,
    CONSTANT,
    ELEMENTWISE,
    GLOBAL,
    INNERMOST,
    MOVE,
    OUTER,
    REDUCE,
    STRIP_ROWS,
    Constant,
    Gir,
    GirPhase,
    GOperator,
    OpCode,
    Reduction,
    RowStep,
    Select,
    bare_sum,
)
from kernorch.codegen.gir.lowering import lower
from kernorch.codegen.gir.memo import constructed, described, remembered, remembering, rewritten
from kernorch.codegen.gir.reductions import SPLIT_MAX_OUTPUTS, TapBound, tap_ranges
from kernorch.codegen.gir.row_permute import VECTOR, RowAccess, row_access, row_loops_of, table_lanes, window
from kernorch.codegen.gir.rules import RULES, Rule, optimize
from kernorch.codegen.gir.tiling import reads_transposed

__all__ = [
    "Constant",
    "OpCode",
    "Reduction",
    "Select",
    "CACHE",
    "CONSTANT",
    "ELEMENTWISE",
    "GLOBAL",
    "GOperator",
    "Gir",
    "GirPhase",
    "INNERMOST",
    "MOVE",
    "OUTER",
    "REDUCE",
    "RULES",
    "STRIP_ROWS",
    "RowAccess",
    "RowStep",
    "Rule",
    "SPLIT_MAX_OUTPUTS",
    "TapBound",
    "VECTOR",
    "bare_sum",
    "tap_ranges",
    "constructed",
    "described",
    "lower",
    "reads_transposed",
    "optimize",
    "remembered",
    "remembering",
    "rewritten",
    "row_access",
    "row_loops_of",
    "table_lanes",
    "window",
]
