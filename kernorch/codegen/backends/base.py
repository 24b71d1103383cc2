"""The Backend interface: one object per way of running a kernel.

A backend says whether it runs a candidate kernel (a `Verdict`, with its reason either way) and, when it does,
what the whole-plan program (codegen/program/plan.py) needs from it: its C source, its scratch buffers, its
rTask variants, and the text its profile signature hashes. What a backend *is* — native or run by Python, an
alias that runs no code, a library-shaped kernel with create/run/destroy — is said by its attributes, so no
caller compares backend names. The registry (registry.py) asks them in order.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from kernorch.ir.kernel import CandidateKernel

# A kernel run by Python: its input arrays (in `kernel.inputs` order) -> its output arrays (`kernel.outputs`)
PythonKernel = Callable[[Sequence[np.ndarray]], Sequence[np.ndarray]]


@dataclass(frozen=True)
class Verdict:
    """Whether a backend runs a kernel, and how (or why not). `claims`: not run, but the kernel is this
    backend's kind (a linear primitive for the library calls, a fusion for generated C), so its reason is the
    kernel's when nothing runs it."""

    runs: bool
    reason: str
    claims: bool = False


def runs(reason: str) -> Verdict:
    return Verdict(True, reason)


def declines(reason: str, claims: bool = False) -> Verdict:
    return Verdict(False, reason, claims)


class Backend:
    """A way of running a kernel. Subclasses set the attributes and override what applies to them."""

    name: str  # unique: what `kernorch explain` and the plan pictures show
    # "generated C", "native C", "library call", "view", "reference", "onnxruntime": pictures colour by it
    family: str
    device: ClassVar[str] = "cpu"  # the plans it serves: "cpu" (the C plan program) or "gpu" (runtime/gpu_plan.py)
    native: ClassVar[bool] = True  # runs inside the plan program's native stretches (not by Python)
    runs_code: ClassVar[bool] = True  # False: an alias of its input's bytes (a view): nothing runs
    # library-shaped: `<name>_create(engine, stream, args)` once, `<name>_run(state, stream, args)` per call,
    # `<name>_destroy(state)`, against the plan's oneDNN engine; otherwise `int <name>(void **args)`
    stateful: ClassVar[bool] = False
    has_gir: ClassVar[bool] = False  # its code is rendered from a GIR (the GIR cost model and explain read it)
    # the label its profile signatures carry: the profile database's keys, kept when backends were split
    signature_label: str

    def applies(self, kernel: CandidateKernel) -> Verdict:
        raise NotImplementedError

    def scratch_bytes(self, kernel: CandidateKernel) -> list[int]:
        """Bytes of each scratch buffer the kernel takes after its inputs and outputs (allocated at create)."""
        return []

    def source(self, name: str, kernel: CandidateKernel) -> str:
        """The C definitions of the kernel, its symbols prefixed by `name`."""
        return ""

    def generic_source(self, name: str, kernel: CandidateKernel) -> str:
        """The C definitions in the form a shape-generic plan unifies across sizes (codegen/generic/): sizes only
        in integer literals of its function bodies, each a polynomial of the sizes where the code is the same
        program of them (no extent rounded up in a literal, no size in a macro or a static table). By default
        `source`: generated C writes its extents as such literals."""
        return self.source(name, kernel)

    def task_source(self, name: str, kernel: CandidateKernel) -> tuple[str, tuple[int, ...]] | None:
        """The kernel as rTask functions and each phase's trip count, or None when it runs whole."""
        return None

    def python_kernel(self, kernel: CandidateKernel) -> PythonKernel | None:
        """For a backend that is not native: the function that runs the kernel, or None for the reference
        implementation of its single primitive (the executor's default)."""
        return None

    def signature_text(self, kernel: CandidateKernel) -> str:
        """What determines the kernel's run time (cost/profile.py hashes it): by default its primitives."""
        graph = kernel.graph
        return json.dumps({
            "nodes": [(n.prim, n.attrs, [str(graph.types[v]) for v in n.inputs],
                       [v in graph.constants for v in n.inputs]) for n in kernel.primitives],
            "outputs": [str(graph.types[v]) for v in kernel.outputs],
        }, default=str)  # fmt: skip

    def summary(self, kernel: CandidateKernel) -> str:
        """How this backend runs the kernel, for `kernorch explain` (the verdict's reason by default)."""
        return self.applies(kernel).reason

    def __repr__(self) -> str:
        return f"<backend {self.name}>"
