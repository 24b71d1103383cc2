"""A kernel of a shape-generic plan as the plan program calls it: its unified source (unify.py) behind an entry
point that takes the sizes as one more input.

The plan program calls `int NAME(void **args)` with the kernel's inputs, outputs and scratch buffers (a library
call: `NAME_create`, `NAME_run`, `NAME_destroy` with its inputs and outputs). A generic kernel's inputs end with
the plan's size array (an int64 input of the plan, written per call): the entry point moves it behind the buffers
the unified code was rendered for, whose body (a library call's run) reads the sizes from there. Its scratch is
what it needs at the range's largest sizes (a generic plan allocates for the largest call).
"""

from __future__ import annotations

from dataclasses import dataclass

from kernorch.codegen.backends.base import Backend, Verdict, runs
from kernorch.codegen.c import SIZES_PARAMETER, SIZES_POINTER
from kernorch.codegen.generic.unify import SIZE_SYMBOL, GenericSource, NotGeneric
from kernorch.ir.kernel import CandidateKernel

PLACEHOLDER = "ko_generic_kernel"  # the name a generic kernel is rendered under at every probe size


@dataclass(frozen=True)
class GenericCode:
    """One kernel's unified code and the buffers it was rendered for."""

    inner: Backend  # the backend that rendered it at every probe size
    source: GenericSource  # rendered as PLACEHOLDER
    inputs: int  # the kernel's inputs, without the size array
    outputs: int
    scratch: tuple[int, ...]  # bytes of each scratch buffer at the range's largest sizes

    @property
    def entry(self) -> tuple[str, str]:
        """The function that reads the sizes (its header as rendered) and its argument array: a library call's
        run (its create, run once before any size is known, may not read them)."""
        if self.inner.stateful:
            return f"static int {PLACEHOLDER}_run(void *state, dnnl_stream_t stream, void **a) {{", "a"
        return f"int {PLACEHOLDER}(void **args) {{", "args"

    def __post_init__(self) -> None:
        header, _ = self.entry
        text = self.source.text
        if text.find(header) < 0:
            raise NotGeneric(f"{self.inner.name}'s code has no entry point {header[:-2]!r} to give sizes to")
        function = ""  # the header of the function a line is in
        for line in text.split("\n"):
            if line.endswith("{") and "(" in line and not line[:1].isspace():
                function = line
            elif SIZE_SYMBOL in line and function != header and not function.endswith(f"{SIZES_PARAMETER}) {{"):
                raise NotGeneric(f"{self.inner.name}'s code reads a size outside its entry point")

    def text(self, inner: str) -> str:
        """The unified code, its symbols prefixed by `inner`, the entry point declaring the sizes it reads from
        the argument behind its buffers, each function given them (SIZES_PARAMETER) declaring those it reads."""
        header, arguments = self.entry
        text = self.source.text.replace(PLACEHOLDER, inner)
        renamed = header.replace(PLACEHOLDER, inner)
        if self.source.is_fixed:  # the same code at every size: nothing reads them (a call passes none)
            if SIZES_POINTER not in text:
                return text
            return text.replace(renamed, f"{renamed}\n    const int64_t *{SIZES_POINTER} = NULL;", 1)
        buffers = self.inputs + self.outputs + len(self.scratch)
        declarations = self.source.declarations(SIZES_POINTER)
        text = text.replace(f"{SIZES_PARAMETER}) {{", f"{SIZES_PARAMETER}) {{\n    {declarations}")
        return text.replace(renamed, f"{renamed}\n    const int64_t *{SIZES_POINTER} = (const int64_t *)"
                                     f"{arguments}[{buffers}]; {declarations}", 1)  # fmt: skip

    def moved(self, arguments: str) -> list[str]:
        """C filling `moved` from the plan's `arguments` (inputs with the size array last, outputs, scratch) in
        the order the unified code reads them: its buffers, then the size array."""
        buffers = self.inputs + self.outputs + len(self.scratch)
        return [f"void *moved[{buffers + 1}];",
                f"for (int i = 0; i < {self.inputs}; i++) moved[i] = {arguments}[i];",
                f"for (int i = 0; i < {self.outputs + len(self.scratch)}; i++) moved[{self.inputs} + i] = "
                f"{arguments}[{self.inputs + 1} + i];",
                f"moved[{buffers}] = {arguments}[{self.inputs}];"]  # fmt: skip


class GenericKernelBackend(Backend):
    """Runs one kernel of a shape-generic plan: `GenericCode` behind the entry point the plan program calls
    (`int NAME(void **args)`)."""

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
        if not self.takes_sizes:
            return self.code.text(name)
        inner = f"{name}_generic"
        return "\n".join([self.code.text(inner), f"int {name}(void **args) {{",
                          *(f"    {line}" for line in self.code.moved("args")), f"    return {inner}(moved);", "}"])

    def summary(self, kernel: CandidateKernel) -> str:
        return self.applies(kernel).reason


class GenericLibraryBackend(GenericKernelBackend):
    """A library-shaped kernel of a shape-generic plan (create once, run per call, destroy): its run reads the
    sizes (codegen/library/run_sizes.py), its create none."""

    stateful = True

    def source(self, name: str, kernel: CandidateKernel) -> str:
        if not self.takes_sizes:
            return self.code.text(name)
        inner = f"{name}_generic"
        return "\n".join([
            self.code.text(inner),
            f"static void {name}_destroy(void *state) {{ {inner}_destroy(state); }}",
            f"static void *{name}_create(dnnl_engine_t engine, dnnl_stream_t stream, void **a) {{",
            *(f"    {line}" for line in self.code.moved("a")),
            f"    return {inner}_create(engine, stream, moved);", "}",
            f"static int {name}_run(void *state, dnnl_stream_t stream, void **a) {{",
            *(f"    {line}" for line in self.code.moved("a")), f"    return {inner}_run(state, stream, moved);", "}",
        ])  # fmt: skip


def generic_backend(code: GenericCode) -> GenericKernelBackend:
    """The backend running `code` in a plan: library-shaped where the backend that rendered it is."""
    return GenericLibraryBackend(code) if code.inner.stateful else GenericKernelBackend(code)
