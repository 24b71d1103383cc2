"""Compile generated C with the system compiler into one shared library per plan, cached on disk.

The cache key is a hash of the source, the flags, the compiler's version line and the CPU's ISA flags,
so a changed compiler, flag or CPU (`-march=native`) never reuses a stale library. Many kernels go into
one translation unit.

The cache is untrusted: anyone who can write it (a shared KERNORCH_CACHE, a restored CI cache) could put a
library under a name computable from a public plan. So a library is only loaded if this user's kernorch
built it: the `kernels/` directory must be private to the user (created 0700; one others can write to, or
owned by someone else, is refused), and each library's HMAC-SHA256 under a secret key kept outside every
cache (`~/.config/kernorch/library.key`, 0600; `KERNORCH_KEY_FILE` overrides; kernorch/signing.py) is written
beside it when it is built and checked before `dlopen`. A library whose MAC is missing or wrong is rebuilt,
never loaded.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import stat
import subprocess
import tempfile
import threading
from functools import cache
from pathlib import Path

from kernorch.codegen.library import ONEDNN_HEADER, onednn_root
from kernorch.errors import KernorchError
from kernorch.machine import isa_digest
from kernorch.options import cache_root
from kernorch.signing import UntrustedCache, private_dir, sign, signed  # noqa: F401 - UntrustedCache: re-exported

# -fno-math-errno and -fno-trapping-math let floor/sqrt vectorize; unlike -ffast-math they keep NaN/inf semantics.
# -mprefer-vector-width=512: GCC 12 takes some AVX-512 CPUs for ones that prefer 256-bit vectors (an AMX Xeon is
# "rocketlake" to it) and vectorizes loops at 256 bits there; the transcendental epilogues (erf, exp, tanh) are
# compute-bound, and whole plans ran 0.96-0.99x the time with 512 (efficientnet_b0, efficientvit_b0, candy,
# vit_tiny, efficientformer_l1; the rest within 1 %: bench/results/2026-11-28-session21.md). Without AVX-512 it
# changes nothing.
CFLAGS = ("-O3", "-march=native", "-mprefer-vector-width=512", "-fopenmp", "-fPIC", "-shared", "-std=gnu11",
          "-fno-math-errno", "-fno-trapping-math",
          "-Werror=implicit-function-declaration")  # a call without a prototype is a codegen bug, never a guess


# `make sanitize`: KERNORCH_SANITIZE=1 builds every library with AddressSanitizer and UndefinedBehaviorSanitizer
# (float-to-integer overflow included), stopping at the first report; the process must preload their runtimes
# (kernorch/devtools/sanitize.py does). Part of the cache key, so sanitized and plain libraries never mix.
SANITIZE_ENV = "KERNORCH_SANITIZE"
SANITIZE_FLAGS = ("-fsanitize=address,undefined,float-cast-overflow", "-fno-sanitize-recover=all",
                  "-fno-omit-frame-pointer", "-g")  # fmt: skip


def sanitize_flags() -> tuple[str, ...]:
    return SANITIZE_FLAGS if os.environ.get(SANITIZE_ENV) == "1" else ()


class CompileError(KernorchError):
    exit_code = 1


@cache
def compiler_identity() -> tuple[str, str]:
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or ""
    if not compiler:
        raise CompileError("no C compiler found (install gcc, or set CC)")
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, check=False).stdout
    return compiler, version.splitlines()[0] if version else "unknown"


def onednn_paths() -> tuple[Path, Path]:
    """(include dir, lib dir) of oneDNN (library/onednn.py: onednn_root), or a CompileError saying how to get it."""
    found = onednn_root()
    if found is None:
        raise CompileError("oneDNN is not installed (linear kernels need it): pip install onednn-cpu-gomp "
                           "onednn-devel-cpu-gomp, or set KERNORCH_ONEDNN_ROOT")
    return found


def link_flags(source: str) -> list[str]:
    """Extra flags for a source that calls oneDNN (the library's rpath, so no LD_LIBRARY_PATH is needed)."""
    if ONEDNN_HEADER not in source:
        return []
    include, lib = onednn_paths()
    return [f"-I{include}", f"-L{lib}", "-ldnnl", f"-Wl,-rpath,{lib}"]


def library_path(source: str, cache_dir: Path | None = None) -> Path:
    compiler, version = compiler_identity()
    key = "\0".join([source, " ".join([*CFLAGS, *sanitize_flags(), *link_flags(source)]), version, isa_digest()])
    return cache_root(cache_dir) / "kernels" / f"kernels_{hashlib.sha256(key.encode()).hexdigest()[:24]}.so"


def _mac(library: Path, data: bytes) -> str:
    return sign("kernorch-library", library.name.encode(), data)


def _mac_path(library: Path) -> Path:
    return library.with_name(library.name + ".mac")


_verified: set[tuple[str, int, int, int, int]] = set()  # (path, device, inode, size, mtime) checked this process
_verified_lock = threading.Lock()


def _identity(path: Path) -> tuple[str, int, int, int, int]:
    info = path.stat()
    return str(path), info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns


def is_trusted(library: Path) -> bool:
    """Whether `library` is a file this user's kernorch built: owned by this user, writable by nobody else, in a
    private directory, and its MAC (under this user's key) is the one recorded beside it when it was built."""
    try:
        identity = _identity(library)
        with _verified_lock:
            if identity in _verified:
                return True
        info = library.lstat()
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o022:
            return False
        recorded = _mac_path(library).read_text().strip()
        trusted = signed(recorded, "kernorch-library", library.name.encode(), library.read_bytes())
    except (OSError, UnicodeDecodeError):
        return False
    if trusted:
        with _verified_lock:
            _verified.add(identity)
    return trusted


def compile_source(source: str, cache_dir: Path | None = None) -> Path:
    """Compile (or find in the cache, built and signed by this user's kernorch) `source`; returns the shared
    library path."""
    target = library_path(source, cache_dir)
    private_dir(target.parent)
    if target.is_file() and is_trusted(target):
        return target
    compiler, _ = compiler_identity()
    with tempfile.TemporaryDirectory(dir=target.parent) as work:
        c_file = Path(work) / "kernels.c"
        c_file.write_text(source)
        so_file = Path(work) / "kernels.so"
        # relative names: the library's bytes do not depend on the temporary directory's name
        result = subprocess.run([compiler, *CFLAGS, *sanitize_flags(), "kernels.c", "-o", "kernels.so",
                                 *link_flags(source), "-lm"], capture_output=True, text=True, check=False,
                                cwd=work)  # fmt: skip
        if result.returncode != 0:
            lines = result.stderr.strip().splitlines() or ["?"]
            # the first error, not GCC's "In function" preamble before it
            first = next((line for line in lines if "error" in line), lines[0])
            raise CompileError(f"C compiler failed: {first}")
        os.chmod(so_file, 0o700)  # whatever the umask: a library others can write is never trusted
        mac_file = Path(work) / "kernels.so.mac"
        mac_file.write_text(_mac(target, so_file.read_bytes()))
        os.replace(mac_file, _mac_path(target))
        os.replace(so_file, target)  # atomic: concurrent compiles of the same source are safe
    return target


def load_library(path: Path) -> ctypes.CDLL:
    """dlopen a library this machine built (checked: `is_trusted`). Its libgomp.so.1 is the process's one OpenMP
    runtime: if torch was imported first, its bundled copy (same soname) is reused; torch imported later reuses
    ours."""
    if not is_trusted(path):
        raise UntrustedCache(f"{path} was not built by this user's kernorch (its MAC does not match): not loaded")
    return ctypes.CDLL(str(path))
