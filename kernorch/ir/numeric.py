"""ONNX's numeric edge cases as onnxruntime computes them, in numpy: the reference interpreter's definitions,
which the generated C (codegen/c/prelude.py, c/expr.py) implements the same way.

- Cast to bool: anything non-zero is true, NaN included.
- Cast from a float to an integer type: truncation toward zero. NaN, and a value whose truncation is out of
  range, give x86-64's "integer indefinite" (the most negative integer) of the 32-bit conversion for types of
  up to 32 bits, of the 64-bit one for 64-bit types; narrower types keep its low bits. Unsigned 32 and 64-bit
  targets convert x − 2^(n−1) when x ≥ 2^(n−1) and flip the top bit back, the usual x86 sequence (float16 to
  uint32 alone keeps the low bits of the 64-bit conversion, as onnxruntime's float16 path does). This is what
  onnxruntime returns on x86-64; C leaves all of it undefined, and numpy's result depends on its SIMD path.
- Integer Div and Mod: a zero divisor is an error (onnxruntime raises too), INT_MIN / −1 wraps to INT_MIN and
  INT_MIN % −1 is 0 (x86's division would trap; onnxruntime's process dies of SIGFPE there).
- Integer Pow: pow in float64, converted as above (onnxruntime: 2^−1 = 0, 0^−1 = INT_MIN).
- Integer Add/Sub/Mul/Neg/Abs wrap around (numpy's own behaviour; Abs(INT_MIN) = INT_MIN).
"""

from __future__ import annotations

import numpy as np


class IntegerDivisionByZero(ValueError):
    """An integer Div or Mod with a zero divisor (onnxruntime refuses it too)."""


def _truncated(x: np.ndarray, bits: int) -> np.ndarray:
    """int64 of x truncated, with the `bits`-bit conversion's integer indefinite where that is out of range."""
    low, high = -(2.0 ** (bits - 1)), 2.0 ** (bits - 1)
    with np.errstate(invalid="ignore"):
        whole = np.trunc(x)
        valid = (whole >= low) & (whole < high)  # NaN compares false
    return np.where(valid, np.where(valid, whole, 0.0).astype(np.int64), np.int64(low))


def float_to_int(x: np.ndarray, dtype: str) -> np.ndarray:
    """Cast of a float array to the integer type `dtype`, as onnxruntime on x86-64 (see the module docstring)."""
    wide = np.asarray(x, dtype=np.float64)  # exact for float16/32; the conversions below decide on float64
    target = np.dtype(dtype)
    bits = 64 if target.itemsize == 8 else 32
    if np.asarray(x).dtype == np.float16 and dtype == "uint32":  # its plain C++ cast: the 64-bit conversion's low bits
        return _truncated(wide, 64).astype(target)
    if target.kind == "u" and target.itemsize >= 4:
        top = 2.0 ** (bits - 1)
        with np.errstate(invalid="ignore"):
            high = wide >= top
        converted = np.where(high, _truncated(wide - top, bits) ^ np.int64(int(top) if bits == 32 else -(2**63)),
                             _truncated(wide, bits))  # fmt: skip
        return converted.astype(target)  # two's complement bits kept: numpy's int -> uint cast wraps
    return _truncated(wide, bits).astype(target)


def cast(x: np.ndarray, dtype: str) -> np.ndarray:
    target = np.dtype(dtype)
    if target == np.bool_:
        return np.asarray(x != 0) if x.dtype.kind != "b" else x.copy()
    if x.dtype.kind == "f" and target.kind in "iu":
        return float_to_int(x, dtype)
    with np.errstate(over="ignore", invalid="ignore"):  # float64 -> float32 overflow is inf, as in C
        return x.astype(target)


def _check_divisor(b: np.ndarray, what: str) -> None:
    if np.any(b == 0):
        raise IntegerDivisionByZero(f"integer {what} by zero")


def int_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Integer division truncating toward zero (numpy's // floors)."""
    _check_divisor(b, "division")
    with np.errstate(over="ignore"):
        quotient = np.floor_divide(a, b)  # INT_MIN // -1 wraps to INT_MIN
        remainder_nonzero = (a - quotient * b) != 0
    return np.where(remainder_nonzero & ((a < 0) != (b < 0)), quotient + 1, quotient).astype(a.dtype)


def int_fmod(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """C's % (the sign of the dividend); INT_MIN % -1 is 0."""
    _check_divisor(b, "modulo")
    safe = np.where(b == -1, 1, b).astype(b.dtype)
    return np.where(b == -1, 0, np.fmod(a, safe)).astype(np.result_type(a, b))


def int_pow(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    dtype = np.result_type(a, b)
    with np.errstate(all="ignore"):
        powered = np.power(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64))
    if dtype.kind == "b":
        return powered != 0
    return float_to_int(powered, dtype.name)
