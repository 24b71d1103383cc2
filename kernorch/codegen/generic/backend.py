"""A kernel of a shape-generic plan as the plan program calls it: its unified source (unify.py) behind an entry
point that takes the sizes as one more input.

The plan program calls `int NAME(void **args)` with the kernel's inputs, outputs and scratch buffers. A generic
kernel's inputs end with the plan's size array (an int64 input of the plan, written per call): the entry point
moves it behind the buffers the unified code was rendered for, whose body reads the sizes from there. Its scratch
is what it needs at the range's largest sizes (a generic plan allocates for the largest call).
"""

from __future__ import annotations

from dataclasses import dataclass

from kernorch.codegen.backends.base import Backend, Verdict, runs
from kernorch.codegen.generic.unify import GenericSource, NotGeneric
from kernorch.ir.kernel import CandidateKernel

PLACEHOLDER = "ko_generic_kernel"  # the name a generic kernel is rendered under at every probe size
SIZES_POINTER = "ko_sizes"


@dataclass(frozen=True)
class GenericCode:
    """One kernel's unified code and the buffers it was rendered for."""

    inner: Backend  # the backend that rendered it at every probe size
    source: GenericSource  # rendered as PLACEHOLDER
    inputs: int  # the kernel's inputs, without the size array
    outputs: int
    scratch: tuple[int, ...]  # bytes of each scratch buffer at the range's largest sizes

    def __post_init__(self) -> None:
        header = f"int {PLACEHOLDER}(void **args) {{"
        text = self.source.text
        start = text.find(header)
        if start < 0:
            raise NotGeneric(f"{self.inner.name}'s code has no entry point `int NAME(void **args)` to give sizes to")
        if not self.source.is_fixed and text.find("ko_size_") < start:  # read where no size is declared
            raise NotGeneric(f"{self.inner.name}'s code reads a size outside its entry point")


class GenericKernelBackend(Backend):
    """Runs one kernel of a shape-generic plan: `GenericCode` behind the entry point the plan program calls."""

    native = True
    runs_code = True
    stateful = False

    def __init__(self, code: GenericCode) -> None:
        self.code = code
        self.name = code.inner.name
        self.family = code.inner.family
        self.signature_label = code.inner.signature_label

    @property
    def takes_sizes(self) -> bool:
        return not self.code.source.is_fixed

    def applies(self, kernel: CandidateKernel) -> Verdict:
        return runs(f"{self.code.inner.name}, generic over {', '.join(sorted(self.code.source.used)) or 'no size'}")

    def scratch_bytes(self, kernel: CandidateKernel) -> list[int]:
        return list(self.code.scratch)

    def source(self, name: str, kernel: CandidateKernel) -> str:
        code = self.code
        if not self.takes_sizes:
            return code.source.text.replace(PLACEHOLDER, name)
        inner = f"{name}_generic"
        buffers = code.inputs + code.outputs + len(code.scratch)
        header = f"int {inner}(void **args) {{"
        text = code.source.text.replace(PLACEHOLDER, inner)
        declarations = (f"const int64_t *{SIZES_POINTER} = (const int64_t *)args[{buffers}]; "
                        + code.source.declarations(SIZES_POINTER))  # fmt: skip
        text = text.replace(header, f"{header}\n    {declarations}", 1)
        # the plan passes inputs (the size array last), outputs, scratch; the unified code reads the size array
        # behind all of its buffers
        return "\n".join([
            text,
            f"int {name}(void **args) {{",
            f"    void *moved[{buffers + 1}];",
            f"    for (int i = 0; i < {code.inputs}; i++) moved[i] = args[i];",
            f"    for (int i = 0; i < {code.outputs + len(code.scratch)}; i++) moved[{code.inputs} + i] = "
            f"args[{code.inputs + 1} + i];",
            f"    moved[{buffers}] = args[{code.inputs}];",
            f"    return {inner}(moved);",
            "}",
        ])  # fmt: skip

    def summary(self, kernel: CandidateKernel) -> str:
        return self.applies(kernel).reason
