"""The reductions' shared facts (REDUCTIONS in ir/primitives.py): the identity each renderer starts its
accumulator from is the value of a reduction over nothing, and C's spelling of it (stdint.h's limits,
math.h's infinities) is that number when compiled."""

from __future__ import annotations

import math
import subprocess
from pathlib import Path

import numpy as np
import pytest

from kernorch.codegen.c.loops import reduction_identity as c_identity
from kernorch.codegen.triton.expr import reduction_identity as triton_identity
from kernorch.devtools.mutate import here
from kernorch.ir.primitives import REDUCTIONS, reduction_identity

INTEGERS = ("int8", "int16", "int32", "int64", "uint8", "uint16")


@pytest.mark.parametrize("dtype", ["float32", "float64", *INTEGERS])
def test_the_identities_are_the_results_over_nothing(dtype: str) -> None:
    low, high = (-math.inf, math.inf) if dtype.startswith("float") else \
        (int(np.iinfo(dtype).min), int(np.iinfo(dtype).max))  # fmt: skip
    assert [reduction_identity(p, dtype) for p in ("reduce_sum", "reduce_prod", "reduce_max", "reduce_min")] == \
        [0, 1, low, high]  # fmt: skip
    assert (reduction_identity("reduce_max", "bool"), reduction_identity("reduce_min", "bool")) == (False, True)


def test_cs_spelling_compiles_to_the_identity(tmp_path: Path) -> None:
    cases = [(p, d) for p in REDUCTIONS for d in (*INTEGERS, "bool")]
    body = "\n".join(f'    printf("%lld\\n", (long long)({c_identity(p, d)[0]}));' for p, d in cases)
    source = tmp_path / "identities.c"
    source.write_text(f"#include <stdint.h>\n#include <stdio.h>\nint main(void) {{\n{body}\n    return 0;\n}}\n")
    subprocess.run(["cc", "-o", str(tmp_path / "identities"), str(source)], check=True)
    printed = subprocess.run([str(tmp_path / "identities")], capture_output=True, text=True, check=True).stdout
    assert [int(line) for line in printed.split()] == [int(reduction_identity(p, d)) for p, d in cases]
    assert (c_identity("reduce_max", "float32")[0], c_identity("reduce_min", "float64")[0]) == ("-INFINITY", "INFINITY")


def test_triton_starts_from_the_same_identity() -> None:
    assert triton_identity("reduce_min", "int32") == f"tl.full([], {2**31 - 1}, tl.int32)"
    assert triton_identity("reduce_prod", "float32") == "tl.full([], 1.0, tl.float32)"


MUTANTS = [
    here("max starts from the highest value, not the lowest",
         '"reduce_max": Reduction(np.max, "lowest", True, "max over axes"),',
         '"reduce_max": Reduction(np.max, "highest", True, "max over axes"),'),
    here("C spells an unsigned minimum's identity as 0 too",
         'return "0" if low else f"{dtype.upper()}_MAX", update', 'return "0", update',
         file="kernorch/codegen/c/loops.py"),
]  # fmt: skip
