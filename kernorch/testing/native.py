"""Helpers for the native kernels' tests (codegen/native/*_test.py): tolerances for long sums and edge values, the
check that a kernel's C compiles for every ISA, the CPU flags a test pretends, and which kernel a small 1x1 conv +
relu gets here."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from kernorch import machine
from kernorch.codegen.backends import LibraryCallBackend, registered
from kernorch.codegen.c import PRELUDE
from kernorch.codegen.library import ONEDNN_PRELUDE, LibraryCall
from kernorch.codegen.program import ERROR_BUFFER, onednn_paths

if TYPE_CHECKING:
    import pytest

AVX2_FLAGS = ("avx", "avx2", "fma", "sse4_2")  # a CPU without AVX-512 (AMD Zen 3)


def assert_close(actual: np.ndarray, expected: np.ndarray) -> None:
    """Sums of a few hundred products cancel: the absolute tolerance follows the outputs' scale."""
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-5 * float(np.abs(expected).max()))


def assert_close_with_edges(actual: np.ndarray, expected: np.ndarray) -> None:
    """NaN and infinities where onnxruntime has them, the finite outputs as `assert_close` compares them."""
    np.testing.assert_array_equal(np.isnan(actual), np.isnan(expected))
    np.testing.assert_array_equal(np.isinf(actual), np.isinf(expected))
    finite = np.isfinite(expected)
    assert_close(actual[finite], expected[finite])


def pretend_isa(monkeypatch: pytest.MonkeyPatch, avx512: bool) -> None:
    """This CPU's flags as one with AVX2 only, or with AVX-512 too: which native kernels take a call depends on it
    (machine.avx512), and their C is one source for every ISA, so a test runs it wherever it runs."""
    monkeypatch.setattr(machine, "isa_flags", lambda: (*AVX2_FLAGS, *(("avx512f", "avx512bw") if avx512 else ())))


def assert_compiles_for(isa: tuple[str, ...], call: LibraryCall, directory: Path) -> None:
    """The call's C compiles with the given ISA flags: the direct kernels' vector width and blocking are the
    compiler's (#ifdef __AVX512F__), so the source does not depend on the machine and both branches must
    compile, though only this machine's one runs in the other tests."""
    source = directory / "conv.c"
    backend = next(b for b in registered() if isinstance(b, LibraryCallBackend) and b.rejection(call) is None)
    source.write_text(ERROR_BUFFER + ONEDNN_PRELUDE + PRELUDE + backend.render_call("k", call))
    include, _ = onednn_paths()
    subprocess.run(["cc", "-fsyntax-only", "-std=gnu11", "-fopenmp", f"-I{include}", *isa,
                    "-Werror=implicit-function-declaration", str(source)], check=True)  # fmt: skip


def small_relu_1x1_kernel() -> str:
    """What `kernorch explain` names the kernel of a 1x1 conv over 16 channels with its relu (a test model's first
    conv): the panel kernel's on CPUs without AVX-512, the pointwise kernel's with it."""
    name = "pointwise_conv" if machine.avx512() else "panel_conv"
    return next(b.what for b in registered() if isinstance(b, LibraryCallBackend) and b.name == name)
