"""The rTask units of a generated kernel are the GIR's (`Gir.task_units`), not something its C renderer reports:
for every single-primitive kernel of three shared models and every fusion of a transformer block, the loops the
rendered rTask variant opens run exactly the iterations its GIR's phases say (the renderer checks, raising
otherwise), across every way a phase is laid out."""

from __future__ import annotations

from collections import Counter

import onnx
import pytest

from kernorch.codegen.backends import GENERATED_C, choose_backend
from kernorch.codegen.c import render
from kernorch.codegen.gir import GirPhase, rewritten
from kernorch.codegen.target import CPU
from kernorch.devtools.mutate import here
from kernorch.ir.kernel import CandidateKernel, make_kernel
from kernorch.pipeline import import_graph

from .conftest import SHARED_MODELS


def _layout(phase: GirPhase) -> str:
    return "+".join(name for name, present in (("rows", phase.steps), ("row blocks", phase.row_block),
                    (phase.reduction, phase.reduction), (f"{phase.tiled} tiles", phase.tiled),
                    ("unrolled", phase.unrolled), ("permuted", phase.row_permuted)) if present) + \
        f"/{phase.parallel.mode}"  # fmt: skip


def _kernels(model: str) -> list[CandidateKernel]:
    path = SHARED_MODELS / f"{model}.onnx"
    if not path.is_file():
        pytest.skip(f"{path} is missing")
    graph = import_graph(onnx.load(path))
    kernels = [make_kernel(graph, (i,), node.outputs) for i, node in enumerate(graph.nodes)]
    return [k for k in kernels if choose_backend(k)[0] is GENERATED_C]


def test_every_generated_kernels_rtask_units_are_its_girs() -> None:
    layouts: Counter[str] = Counter()
    for model in ("segformer_b0", "shufflenet_v2", "candy"):
        for kernel in _kernels(model):
            gir = rewritten(kernel, CPU)
            render("k", gir, CPU, tasks=True)  # raises AssertionError when the loops opened differ from the GIR's
            layouts.update(_layout(phase) for phase in gir.phases)
    assert {"rows+row blocks/outer", "rows+row blocks/serial", "blocks tiles/outer", "strips tiles/outer",
            "unrolled/outer", "/outer", "/innermost", "/serial"} <= set(layouts), layouts  # fmt: skip


# The mutants of the code this file tests, each a one-line change a real bug could make and that these tests must
# catch (`make mutate`: kernorch/devtools/mutate.py collects them)
MUTANTS = [
    # the rTask units recorded in the GIR
    here("a transpose's strips are counted as tiles",
         "return around * -(-size_b // STRIP_ROWS)",
         "return around * -(-size_b // tile)",
         file="kernorch/codegen/gir/graph.py"),
    here("an unrolled short loop counts as the vector loop",
         "inner = -2 if self.unrolled or self.row_permuted else -1",
         "inner = -1",
         file="kernorch/codegen/gir/graph.py"),
]  # fmt: skip
