"""A plan's Triton kernels as one importable module, and launching them on torch tensors.

Triton reads a jitted function's source from its file, so the module is written to the private compile cache
(0700, under a name that is the hash of its text) and imported from there. Only text this process generated
(or regenerated from a saved plan and found equal to it: runtime/artifact.py) is ever written and imported.

Without a GPU, kernels run in Triton's interpreter (`TRITON_INTERPRET=1`, set before triton is imported) on
CPU tensors: what `kernorch check --compiled --device a100` and the tests use.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from kernorch.codegen.triton.expr import PRELUDE
from kernorch.codegen.triton.render import TritonKernel
from kernorch.errors import KernorchError
from kernorch.options import cache_root, writable_dir

_LOCK = threading.Lock()
_MODULES: dict[str, ModuleType] = {}


def module_source(kernels: Sequence[TritonKernel]) -> str:
    """The text of a module holding `kernels` (the prelude's helpers first)."""
    return PRELUDE + "".join(f"\n\n# kernel {k.name}\n{k.source}" for k in kernels)


def nvidia_device_present() -> bool:
    """Whether this machine has an NVIDIA GPU (its device files; no CUDA initialisation, no torch import)."""
    return any(Path("/dev").glob("nvidia[0-9]*"))


def choose_interpreter() -> None:
    """Without a GPU, run Triton in its interpreter. Triton decorates its own library (`tl.zeros`, `tl.sum`...)
    when it is imported, reading TRITON_INTERPRET then, so this runs when kernorch's codegen is imported, before
    anything here imports triton; an explicit TRITON_INTERPRET is kept."""
    if "triton" not in sys.modules and not nvidia_device_present():
        os.environ.setdefault("TRITON_INTERPRET", "1")


def use_interpreter_without_gpu() -> bool:
    """Whether generated Triton kernels run in Triton's interpreter in this process; refuses in one line when they
    would need it but Triton was imported without it (its library compiled for a GPU)."""
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    if not interpreted and not nvidia_device_present():
        raise KernorchError("no GPU here, and Triton was imported before kernorch could choose its interpreter: "
                            "set TRITON_INTERPRET=1 before importing triton")  # fmt: skip
    return interpreted


def load_module(source: str, cache_dir: Path | None = None) -> ModuleType:
    """Import generated module text (cached by its hash, in memory and in the private cache directory)."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:24]
    with _LOCK:
        if digest in _MODULES:
            return _MODULES[digest]
        try:
            import triton  # noqa: F401 - a clear refusal here beats an ImportError inside the module
        except ImportError:
            raise KernorchError("GPU plans need Triton (pip install triton==3.9.0, `make install` does)") from None
        directory = writable_dir(cache_root(cache_dir) / "triton", "generated Triton kernels")
        os.chmod(directory, 0o700)
        path = directory / f"kernels_{digest}.py"
        partial = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
        partial.write_text(source)
        os.replace(partial, path)  # always our own text: rewritten, never trusted as found
        spec = importlib.util.spec_from_file_location(f"kernorch_triton_{digest}", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _MODULES[digest] = module
        return module


def launch(module: ModuleType, kernel: TritonKernel, tensors: Sequence[Any], tables: Sequence[Any],
           error: Any) -> None:  # fmt: skip
    """Run every launch of `kernel` on its buffers (`tensors`: inputs, outputs, scratch), its tables and the
    error flag, in order on the current stream."""
    arguments = [*tensors, *tables, error]
    for step in kernel.launches:
        if step.programs:  # an empty tensor: nothing to launch (a grid of 0 is an error)
            getattr(module, step.function)[(step.programs,)](*arguments)
