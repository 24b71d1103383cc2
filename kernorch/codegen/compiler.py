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
import sys
import tempfile
from functools import cache
from pathlib import Path

from kernorch.errors import KernorchError
from kernorch.machine import isa_digest
from kernorch.options import cache_root, writable_dir

# -fno-math-errno and -fno-trapping-math let floor/sqrt vectorize; unlike -ffast-math they keep NaN/inf semantics.
CFLAGS = ("-O3", "-march=native", "-fopenmp", "-fPIC", "-shared", "-std=gnu11", "-fno-math-errno", "-fno-trapping-math",
          "-Werror=implicit-function-declaration")  # a call without a prototype is a codegen bug, never a guess


class CompileError(KernorchError):
    exit_code = 1


@cache
def compiler_identity() -> tuple[str, str]:
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or ""
    if not compiler:
        raise CompileError("no C compiler found (install gcc, or set CC)")
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, check=False).stdout
    return compiler, version.splitlines()[0] if version else "unknown"


ONEDNN_HEADER = "oneapi/dnnl/dnnl.h"


@cache
def onednn_paths() -> tuple[Path, Path]:
    """(include dir, lib dir) of oneDNN: $KERNORCH_ONEDNN_ROOT, else the onednn-*-cpu-gomp wheels' prefix."""
    roots = [Path(os.environ["KERNORCH_ONEDNN_ROOT"])] if os.environ.get("KERNORCH_ONEDNN_ROOT") else []
    roots += [Path(sys.prefix), Path(sys.base_prefix), Path("/usr/local"), Path("/usr")]
    for root in roots:
        include, lib = root / "include", root / "lib"
        if (include / ONEDNN_HEADER).is_file() and any(lib.glob("libdnnl.so*")):
            return include, lib
    raise CompileError("oneDNN is not installed (linear kernels need it): pip install onednn-cpu-gomp "
                       "onednn-devel-cpu-gomp, or set KERNORCH_ONEDNN_ROOT")


def link_flags(source: str) -> list[str]:
    """Extra flags for a source that calls oneDNN (the library's rpath, so no LD_LIBRARY_PATH is needed)."""
    if ONEDNN_HEADER not in source:
        return []
    include, lib = onednn_paths()
    return [f"-I{include}", f"-L{lib}", "-ldnnl", f"-Wl,-rpath,{lib}"]


def library_path(source: str, cache_dir: Path | None = None) -> Path:
    compiler, version = compiler_identity()
    key = "\0".join([source, " ".join([*CFLAGS, *link_flags(source)]), version, isa_digest()])
    return cache_root(cache_dir) / "kernels" / f"kernels_{hashlib.sha256(key.encode()).hexdigest()[:24]}.so"


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
        result = subprocess.run([compiler, *CFLAGS, str(c_file), "-o", str(so_file), *link_flags(source), "-lm"],
                                capture_output=True, text=True, check=False)  # fmt: skip
        if result.returncode != 0:
            lines = result.stderr.strip().splitlines() or ["?"]
            # the first error, not GCC's "In function" preamble before it
            first = next((line for line in lines if "error" in line), lines[0])
            raise CompileError(f"C compiler failed: {first}")
        os.replace(so_file, target)  # atomic: concurrent compiles of the same source are safe
    return target


def load_library(path: Path) -> ctypes.CDLL:
    """dlopen a library this machine built. Its libgomp.so.1 is the process's one OpenMP runtime: if torch
    was imported first, its bundled copy (same soname) is reused; torch imported later reuses ours."""
    return ctypes.CDLL(str(path))
