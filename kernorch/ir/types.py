"""Static tensor types: a shape of non-negative ints and a numpy dtype name."""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes  # noqa: F401  (registers numpy's "bfloat16" dtype)
import numpy as np

from kernorch.ir.contracts import elements

# dtypes a model may hold (the frontend's and the reference interpreter's); anything else (bfloat16, float8,
# strings) is refused.
SUPPORTED_DTYPES = frozenset(
    {
        "float16", "float32", "float64",
        "int8", "int16", "int32", "int64",
        "uint8", "uint16", "uint32", "uint64",
        "bool",
    }
)  # fmt: skip
FLOAT_DTYPES = frozenset({"float16", "float32", "float64"})
# dtypes only kernorch creates: bfloat16 storage of a bf16 linear primitive's operand (the precision stage's casts,
# kernorch/precision/). A model holding one is still refused (the frontend checks SUPPORTED_DTYPES).
STORAGE_DTYPES = frozenset({"bfloat16"})


@dataclass(frozen=True, slots=True)
class TensorType:
    shape: tuple[int, ...]
    dtype: str

    def __post_init__(self) -> None:
        if self.dtype not in SUPPORTED_DTYPES and self.dtype not in STORAGE_DTYPES:
            raise ValueError(f"unsupported dtype {self.dtype}")
        if any((not isinstance(d, int)) or d < 0 for d in self.shape):
            raise ValueError(f"shape must be static non-negative ints, got {self.shape}")
        elements(self.shape, "a tensor")  # bounded: no size computed from it wraps around

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return self.numel * np.dtype(self.dtype).itemsize

    @property
    def is_float(self) -> bool:
        return self.dtype in FLOAT_DTYPES or self.dtype == "bfloat16"

    @staticmethod
    def of(array: np.ndarray) -> TensorType:
        return TensorType(tuple(int(d) for d in array.shape), array.dtype.name)

    def __str__(self) -> str:
        return f"{self.dtype}[{'x'.join(map(str, self.shape))}]"
