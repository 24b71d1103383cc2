"""A/B of the row-permuted upsampling kernel (codegen/c/render_permuted.py): input rows read in place (now)
against the rows first copied into an aligned array (before 2026-11-28's change, rebuilt here by rewriting the
rendered C). The copy is two 256-bit stores per 16 floats where GCC prefers 256-bit vectors, and each 512-bit
read of it then waits for both stores to retire. Both variants compiled in this process and alternated; prints
median microseconds per call and the ratio (in place / copy). Run on a quiet machine:

    OMP_NUM_THREADS=2 .venv/bin/python bench/row_permuted_copy.py
"""

from __future__ import annotations

import ctypes
import re
import time

import numpy as np

from kernorch.codegen.backends import GENERATED_C
from kernorch.codegen.c.prelude import PRELUDE
from kernorch.codegen.loops.resize_taps_test import _upsampling
from kernorch.codegen.program.compiler import compile_source, load_library
from kernorch.ir.kernel import make_kernel

CASES = [((1, 64, 64, 32), 4, "linear"), ((1, 32, 128, 16), 8, "linear"), ((1, 64, 32, 64), 2, "linear"),
         ((1, 32, 32, 128), 2, "nearest")]  # fmt: skip
ROUNDS, CALLS = 15, 50


def copied_rows(source: str, width: int) -> str:
    """The rendered C with each input row copied into an aligned array, as it was rendered before."""
    return re.sub(r"const float \*(ko_x\d+) = (&[^;]+);",
                  lambda m: f"float {m[1]}[{width}] __attribute__((aligned(64))); "
                            f"memcpy({m[1]}, {m[2]}, sizeof {m[1]});", source)  # fmt: skip


def main() -> None:
    for shape, factor, mode in CASES:
        graph = _upsampling(shape, factor, mode, False)
        kernel = make_kernel(graph, tuple(range(len(graph.nodes))), ("y",))
        new = GENERATED_C.source("k", kernel)
        variants = {"copy": copied_rows(new, shape[-1]), "in place": new}
        assert variants["copy"] != new
        libraries = {name: load_library(compile_source(PRELUDE + "#include <string.h>\n" + source))
                     for name, source in variants.items()}  # fmt: skip
        rng = np.random.default_rng(0)
        inputs = [rng.standard_normal(graph.types[name].shape).astype(np.float32) for name in kernel.inputs]
        outputs = {name: np.empty(graph.types["y"].shape, np.float32) for name in variants}
        pointers = {name: (ctypes.c_void_p * (len(inputs) + 1))(*(a.ctypes.data for a in inputs),
                                                                 outputs[name].ctypes.data)
                    for name in variants}  # fmt: skip
        times: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(ROUNDS):
            for name, library in libraries.items():
                for _ in range(5):
                    library.k(pointers[name])
                started = time.perf_counter()
                for _ in range(CALLS):
                    library.k(pointers[name])
                times[name].append((time.perf_counter() - started) / CALLS * 1e6)
        np.testing.assert_array_equal(outputs["copy"], outputs["in place"])
        medians = {name: float(np.median(values)) for name, values in times.items()}
        print(f"{shape} x{factor} {mode}: copy {medians['copy']:.1f} us, in place {medians['in place']:.1f} us, "
              f"ratio {medians['in place'] / medians['copy']:.3f}", flush=True)


if __name__ == "__main__":
    main()
