"""What this machine is: CPU model, core count and ISA flags.

Generated code is built with `-march=native`, so a compiled library is only valid on a CPU with the same
ISA: the flags go into the compile-cache key and into saved plans. Measured kernel costs are only valid on
the same CPU model and core count: the fingerprint keys the profile database.
"""

from __future__ import annotations

import hashlib
import os
import platform
from functools import cache
from pathlib import Path

from kernorch.errors import KernorchError


@cache
def _cpuinfo() -> dict[str, str]:
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, sep, value = line.partition(":")
            if sep and key.strip() not in fields:
                fields[key.strip()] = value.strip()
            if not line.strip() and fields:
                break  # the first processor is enough: all cores of a machine are alike here
    except OSError:
        pass
    return fields


def cpu_model() -> str:
    return _cpuinfo().get("model name") or platform.processor() or platform.machine()


def cpu_family_model() -> str:
    """"family F model M" as /proc/cpuinfo gives them: a VM may name the CPU by its vendor's brand only."""
    fields = _cpuinfo()
    return f"family {fields.get('cpu family', '?')} model {fields.get('model', '?')}"


def isa_flags() -> tuple[str, ...]:
    """The CPU's feature flags, sorted (what `-march=native` may use)."""
    return tuple(sorted(set(_cpuinfo().get("flags", platform.machine()).split())))


def avx512() -> bool:
    """Whether this CPU has AVX-512 (any of its extensions): the AVX2 kernels of codegen/native step aside there."""
    return any(flag.startswith("avx512") for flag in isa_flags())


def bf16_supported() -> bool:
    """Whether this CPU multiplies bfloat16 in hardware (AVX512-BF16 or AMX-BF16)."""
    return bool(set(isa_flags()) & {"avx512_bf16", "amx_bf16"})


# The instructions that add int8 products into int32 sums directly. Without them (AVX2, AVX-512 before Cascade
# Lake: AMD Zen 3, say) oneDNN multiplies unsigned by signed bytes with vpmaddubsw, which adds each pair of products
# in a saturating int16: 2 * 255 * 127 does not fit, so sums ONNX defines as exact come out clipped
INT8_DOT_PRODUCT_FLAGS = frozenset({"avx512_vnni", "avx_vnni", "amx_int8"})
# What saturates without them: a pair of products of an unsigned byte (up to 255) and a weight fits int16 while
# 2 * 255 * |w| <= 32767, so weights within 64 (7 bits) sum exactly (onnxruntime's remedy too: reduce_range)
SATURATION_FREE_WEIGHT = 64


def int8_dot_products() -> bool:
    """Whether this CPU adds int8 products into int32 sums exactly in hardware (VNNI or AMX-INT8)."""
    return bool(set(isa_flags()) & INT8_DOT_PRODUCT_FLAGS)


def check_bf16_supported() -> None:
    """One line refusing bf16 arithmetic on a CPU without bfloat16 instructions (oneDNN would emulate it, slower
    than float32: the mode exists to be faster, so it is refused rather than emulated)."""
    if not bf16_supported():
        raise KernorchError("precision bf16 needs a CPU with AVX512-BF16 or AMX-BF16 instructions; this one has "
                            "neither (use --precision fp32)")


def isa_digest() -> str:
    """A short hash of the ISA flags: equal digests mean a `-march=native` library runs here."""
    return hashlib.sha256(" ".join(isa_flags()).encode()).hexdigest()[:16]


def fingerprint() -> str:
    """CPU model and core count: the key of measured costs (profiles, calibration)."""
    return f"{cpu_model()}|{os.cpu_count()}"
