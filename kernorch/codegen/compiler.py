"""Compile generated C with the system compiler into one shared library per plan, cached on disk.

The cache key is a hash of the source, the flags, the compiler's version line and the CPU's ISA flags,
so a changed compiler, flag or CPU (`-march=native`) never reuses a stale library. Many kernels go into
one translation unit.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path

from kernorch.errors import KernorchError
from kernorch.machine import isa_digest
from kernorch.options import cache_root, writable_dir

# -fno-math-errno and -fno-trapping-math let floor/sqrt vectorize; unlike -ffast-math they keep NaN/inf semantics.
CFLAGS = ("-O3", "-march=native", "-fopenmp", "-fPIC", "-shared", "-std=gnu11", "-fno-math-errno", "-fno-trapping-math")


class CompileError(KernorchError):
    exit_code = 1


@cache
def compiler_identity() -> tuple[str, str]:
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or ""
    if not compiler:
        raise CompileError("no C compiler found (install gcc, or set CC)")
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, check=False).stdout
    return compiler, version.splitlines()[0] if version else "unknown"


def library_path(source: str, cache_dir: Path | None = None) -> Path:
    compiler, version = compiler_identity()
    digest = hashlib.sha256("\0".join([source, " ".join(CFLAGS), version, isa_digest()]).encode()).hexdigest()[:24]
    return cache_root(cache_dir) / "kernels" / f"kernels_{digest}.so"


def compile_source(source: str, cache_dir: Path | None = None) -> Path:
    """Compile (or find in the cache) `source`; returns the shared library path."""
    target = library_path(source, cache_dir)
    if target.is_file():
        return target
    compiler, _ = compiler_identity()
    writable_dir(target.parent, "compiled kernels")
    with tempfile.TemporaryDirectory(dir=target.parent) as work:
        c_file = Path(work) / "kernels.c"
        c_file.write_text(source)
        so_file = Path(work) / "kernels.so"
        result = subprocess.run([compiler, *CFLAGS, str(c_file), "-o", str(so_file), "-lm"],
                                capture_output=True, text=True, check=False)  # fmt: skip
        if result.returncode != 0:
            first = (result.stderr.strip().splitlines() or ["?"])[0]
            raise CompileError(f"C compiler failed: {first}")
        os.replace(so_file, target)  # atomic: concurrent compiles of the same source are safe
    return target


def load_library(path: Path) -> ctypes.CDLL:
    # torch first: its bundled libgomp.so.1 is then the process's OpenMP runtime, and the generated code
    # (linked against the same soname) binds to it instead of starting a second thread pool.
    import torch  # noqa: F401

    return ctypes.CDLL(str(path))
