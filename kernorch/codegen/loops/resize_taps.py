"""A resize along one axis as taps and weights, computed with the reference code's own coordinate rules.

Resize is linear along each axis, so mapping the identity through the reference gives, per output position,
the inputs it reads and their weights: a table the generated kernel looks up. An integer-factor upsampling
(SegFormer's decode head doubles, quadruples and octuples its maps) has more structure: the taps of output
f·q + r are q plus an offset that depends on r alone, so a kernel split along that axis into residues reads
its input unit-stride (`periodic_taps`).
"""

from __future__ import annotations

import functools

import numpy as np

from kernorch.ir import reference_kernels as K

# (factor f, offsets [f, width], weights [f, width], low, high): see periodic_taps
Periodic = tuple[int, np.ndarray, np.ndarray, int, int]

MAX_RESIDUES = 8  # an upsampling factor up to this is unrolled residue by residue (segformer_b0's are 2, 4, 8)


def residue_factor(factors: set[int], size: int, shortest: int) -> int | None:
    """The factor to split an innermost loop of `size` by, for the upsampling factors read along it: their
    least common multiple, when it is small enough to unroll and leaves a loop of at least `shortest` to
    vectorize."""
    if not factors:
        return None
    factor = int(np.lcm.reduce(sorted(factors)))
    if factor > MAX_RESIDUES or size % factor or size // factor < shortest:
        return None
    return factor


@functools.lru_cache(maxsize=512)
def periodic_taps(size_in: int, size_out: int, scale: float, mode: str, coordinate_mode: str, nearest_mode: str,
                  cubic_coeff_a: float, exclude_outside: bool) -> Periodic | None:  # fmt: skip
    """An upsampling by an integer factor f whose taps repeat: output f·q + r reads inputs q + offsets[r, t],
    clamped to the axis, with weights[r, t], for every q: (f, offsets [f, width], weights [f, width], low,
    high), where a clamp can bite only for q < low or q >= size_in - high. None when the resize is not such
    (checked against the whole reference map: ONNX's linear and cubic modes with half_pixel coordinates are;
    align_corners is not)."""
    table = resize_taps(size_in, size_out, scale, mode, coordinate_mode, nearest_mode, cubic_coeff_a,
                        exclude_outside)  # fmt: skip
    if table is None or size_out <= size_in or size_out % size_in:
        return None
    factor = size_out // size_in
    taps, weights = table
    middle = size_in // 2  # the pattern is read off an interior position, then checked everywhere
    offsets = taps[factor * middle: factor * (middle + 1)] - middle
    pattern = weights[factor * middle: factor * (middle + 1)]
    rows = np.arange(size_out)
    q = rows // factor
    rebuilt = merged_rows(np.clip(q[:, None] + offsets[rows % factor], 0, size_in - 1),
                          pattern[rows % factor].astype(np.float64))  # fmt: skip
    matches = rebuilt[0].shape == taps.shape and np.array_equal(rebuilt[0], taps) and \
        np.allclose(rebuilt[1], weights, rtol=0, atol=1e-6)  # fmt: skip
    if not matches:
        return None
    offsets, pattern = np.ascontiguousarray(offsets), np.ascontiguousarray(pattern)
    offsets.setflags(write=False)
    pattern.setflags(write=False)
    return factor, offsets, pattern, max(0, -int(offsets.min())), max(0, int(offsets.max()))


def merged_rows(taps: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the distinct input positions with a non-zero total weight, ascending, and those totals (float64),
    padded to the widest row with weight 0 at the row's own first position: the table's canonical form (a
    clamped tap repeats a position; a tap may carry no weight). Padding at position 0 read a NaN there into
    rows far from it (0 · NaN), lraspp's last rows from its first. O(rows × taps)."""
    rows = taps.shape[0]
    merged: list[list[tuple[int, float]]] = []
    for o in range(rows):
        totals: dict[int, float] = {}
        for position, weight in zip(taps[o].tolist(), weights[o].tolist(), strict=True):
            totals[position] = totals.get(position, 0.0) + weight
        merged.append(sorted((p, w) for p, w in totals.items() if w != 0.0))
    width = max(1, max((len(row) for row in merged), default=1))
    out_taps = np.zeros((rows, width), dtype=np.int64)
    out_weights = np.zeros((rows, width), dtype=np.float64)
    for o, row in enumerate(merged):
        out_taps[o, :] = row[0][0] if row else taps[o, 0]
        for t, (position, weight) in enumerate(row):
            out_taps[o, t], out_weights[o, t] = position, weight
    return out_taps, out_weights


@functools.lru_cache(maxsize=512)
def resize_taps(size_in: int, size_out: int, scale: float, mode: str, coordinate_mode: str, nearest_mode: str,
                cubic_coeff_a: float, exclude_outside: bool) -> tuple[np.ndarray, np.ndarray] | None:  # fmt: skip
    """A resize along one axis as ([size_out, width] input taps, their float32 weights), computed with the
    reference code's own coordinate rules; None where the axis is left as it is. Cached (read-only arrays):
    tuning describes the same decode-head resizes in thousands of candidates, and building this table per
    output row took a tenth of segformer_b0's cold tuning."""
    if size_in == size_out and scale == 1.0:
        return None
    taps, weights = merged_rows(*K.axis_taps(size_in, size_out, scale, mode, coordinate_mode, nearest_mode,
                                             cubic_coeff_a, exclude_outside))  # fmt: skip
    if size_in == size_out and np.array_equal(taps[:, 0], np.arange(size_in)) and np.all(weights[:, 0] == 1) \
            and not weights[:, 1:].any():  # fmt: skip
        return None
    taps.setflags(write=False)
    single = weights.astype(np.float32)
    single.setflags(write=False)
    return taps, single
