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
    """An upsampling by an integer factor f whose taps repeat: output f·q + r reads inputs q + offsets[r, t]
    with weights[r, t] for every q in [low, size_in - high), where no tap leaves the axis: (f, offsets
    [f, width], weights [f, width], low, high). The outputs of the other q (the borders, where coordinates and
    taps are clamped) read the table of `resize_taps`. None when the resize is not such (checked against the
    reference map: ONNX's linear and cubic modes with half_pixel coordinates are; align_corners is not)."""
    table = resize_taps(size_in, size_out, scale, mode, coordinate_mode, nearest_mode, cubic_coeff_a,
                        exclude_outside)  # fmt: skip
    if table is None or size_out <= size_in or size_out % size_in:
        return None
    factor = size_out // size_in
    taps, weights = table
    middle = size_in // 2  # the pattern is read off an interior position, then checked on every interior one
    offsets = taps[factor * middle: factor * (middle + 1)] - middle
    pattern = weights[factor * middle: factor * (middle + 1)]
    low, high = max(0, -int(offsets.min())), max(0, int(offsets.max()))
    interior = slice(factor * low, factor * max(low, size_in - high))
    rows = np.arange(size_out)[interior]
    expected = pattern[rows % factor]  # equal to float32 rounding; a zero weight (0 · inf is NaN) exactly
    matches = np.array_equal(taps[interior], rows[:, None] // factor + offsets[rows % factor]) and \
        np.allclose(weights[interior], expected, rtol=0, atol=1e-6) and \
        np.array_equal(weights[interior] == 0, expected == 0)  # fmt: skip
    if not matches:
        return None
    offsets, pattern = np.asarray(offsets, order="C"), np.asarray(pattern, order="C")
    offsets.setflags(write=False)
    pattern.setflags(write=False)
    return factor, offsets, pattern, low, high


@functools.lru_cache(maxsize=512)
def resize_taps(size_in: int, size_out: int, scale: float, mode: str, coordinate_mode: str, nearest_mode: str,
                cubic_coeff_a: float, exclude_outside: bool) -> tuple[np.ndarray, np.ndarray] | None:  # fmt: skip
    """A resize along one axis as ([size_out, width] input taps, their float32 weights), exactly the reference's
    (`axis_taps`: every tap onnxruntime reads, a zero weight or a repeated position included, so a NaN or an
    inf reaches the outputs it reaches there); None where the axis is left as it is. Cached (read-only arrays):
    tuning describes the same decode-head resizes in thousands of candidates, and building this table per
    output row took a tenth of segformer_b0's cold tuning."""
    if size_in == size_out and scale == 1.0:
        return None
    taps, weights = K.axis_taps(size_in, size_out, scale, mode, coordinate_mode, nearest_mode, cubic_coeff_a,
                                exclude_outside)  # fmt: skip
    if size_in == size_out and taps.shape[1] == 1 and np.array_equal(taps[:, 0], np.arange(size_out)):
        return None  # a nearest resize that reads every input where it is
    taps.setflags(write=False)
    single = weights.astype(np.float32)
    single.setflags(write=False)
    return taps, single
