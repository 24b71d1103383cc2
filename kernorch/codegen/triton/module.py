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


def use_interpreter_without_gpu() -> bool:
    """Run Triton in its interpreter unless a CUDA device is present. Must precede the first `import triton`:
    Triton reads TRITON_INTERPRET when it is imported. True when kernels will be interpreted."""
    if "triton" not in sys.modules and not _cuda_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    return os.environ.get("TRITON_INTERPRET") == "1"


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def load_module(source: str, cache_dir: Path | None = None) -> ModuleType:
    """Import generated module text (cached by its hash, in memory and in the private cache directory)."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:24]
    with _LOCK:
        if digest in _MODULES:
            return _MODULES[digest]
        use_interpreter_without_gpu()
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
        getattr(module, step.function)[(step.programs,)](*arguments)
