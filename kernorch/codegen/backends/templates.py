"""Hand-written C templates (codegen/native/): for opaque primitives, the LSTM scan and stacked LSTM layers run
as waves; for a pattern of primitives, fused attention. Each runs whole: it synchronises its own threads (the
scan with a barrier per step, the stack with a step counter per layer, attention splits its heads' row blocks
in one parallel region), so it has no rTask variants. Each template declares its `CTemplate` in its own module
(codegen/native/lstm.py, lstm_stack.py, attention.py, as `BACKEND`)."""

from __future__ import annotations

from collections.abc import Callable

from kernorch.codegen.backends.base import Backend, Verdict, declines, runs
from kernorch.codegen.c import prelude_used_by
from kernorch.ir.kernel import CandidateKernel


class CTemplate(Backend):
    family = "native C"
    signature_label = "c"  # as generated C: the profile keys of these kernels predate the split

    def __init__(self, name: str, what: str, supported: Callable[[CandidateKernel], bool],
                 scratch: Callable[[CandidateKernel], list[int]], render: Callable[[str, CandidateKernel], str],
                 structure: Callable[[CandidateKernel], str],
                 generic_render: Callable[[str, CandidateKernel], str] | None = None) -> None:  # fmt: skip
        self.name, self.what = name, what
        self._supported, self._scratch, self._render, self._structure = supported, scratch, render, structure
        self._generic_render = generic_render or render

    def applies(self, kernel: CandidateKernel) -> Verdict:
        return runs(self.what) if self._supported(kernel) else declines(f"not a kernel the {self.what} runs")

    def scratch_bytes(self, kernel: CandidateKernel) -> list[int]:
        return self._scratch(kernel)

    def source(self, name: str, kernel: CandidateKernel) -> str:
        return self._render(name, kernel)

    def generic_source(self, name: str, kernel: CandidateKernel) -> str:
        return self._generic_render(name, kernel)

    def signature_text(self, kernel: CandidateKernel) -> str:
        code = self.source("k", kernel)
        return prelude_used_by(code) + code

    def summary(self, kernel: CandidateKernel) -> str:
        return f"{self.what}: {self._structure(kernel)}"
