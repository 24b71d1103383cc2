"""Does a compiled candidate kernel compute what the reference interpreter does? One run on the profiler's seeded
inputs, its outputs against the reference's: floats within RTOL of the largest magnitude among the output and the
inputs, or within SENSITIVITY times what nudging the inputs moves the reference (NaN where it has NaN); bfloat16
within one bfloat16 step (plus RTOL of that magnitude); other dtypes exactly. The profiler asks before it trusts
a measurement (a kernel that fails is dropped from the plan with the reason); `make compile-check --run` asks it
of every candidate of the shared models.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np

from kernorch.ir.kernel import CandidateKernel
from kernorch.runtime.reference import run_reference

RTOL = 1e-4  # float32 kernels against the reference: reassociated sums, approximated exp/erf/tanh
NUDGE = 2.0**-16  # relative change of each float input (~128 ulps): the reference moves about as far as a
# float32 kernel summing in lane partials may (x / Σx with Σx near 0: 0.2 % from float64 with 256 terms)
SENSITIVITY = 8.0  # a kernel may be this many times as far from the reference as the nudged reference is
# A bfloat16 output may sit one bfloat16 step from the reference's: a float32 value within RTOL of the reference's
# (an approximated erf, sums in another order) rounds to the neighbouring bfloat16 where the two straddle the
# midpoint. 8 significant bits: a value in [2^e, 2^(e+1)) has steps of 2^(e-7).
BF16_BITS = 8
SENTINEL = 1e30  # magnitudes from here up are masks' stand-ins for -inf (float32's lowest, -1e38), not data


def output_mismatch(kernel: CandidateKernel, buffers: Mapping[str, np.ndarray]) -> str | None:
    """Why the kernel's outputs in `buffers` (after one run on the graph inputs there) are wrong, or None.
    `kernel` is isolated (profile.isolate): its graph's inputs are what it read."""
    feeds = {name: buffers[name] for name in kernel.graph.inputs}
    reference = run_reference(kernel.graph, feeds)
    nudged: dict[str, np.ndarray] | None = None  # only where the plain bound is not met: a second reference run
    for name in kernel.outputs:
        got, want = buffers[name], reference[name]
        if want.dtype.name == "bfloat16":
            if (problem := _bfloat16_mismatch(name, got, want, feeds)) is not None:
                return problem
            continue
        if not np.issubdtype(want.dtype, np.floating):
            if np.array_equal(got, want):
                continue
            return f"output {name} differs from the reference ({int(np.count_nonzero(got != want))} elements)"
        scale = _scale(want, feeds.values())
        want64 = want.astype(np.float64)  # float32 |want| + scale overflows near float32's max (masks of -3.4e38)
        with np.errstate(invalid="ignore"):  # inf - inf: compared as exact below
            error = np.abs(got.astype(np.float64) - want64)
        exact = (np.isnan(got) & np.isnan(want)) | (got == want)
        if bool(np.all((error <= RTOL * (np.abs(want64) + scale)) | exact)):
            continue
        if nudged is None:
            nudged = run_reference(kernel.graph, _nudged(feeds))
        # as far as inputs a few ulps off move the reference (a division by a sum near 0)
        with np.errstate(invalid="ignore"):
            sensitivity = np.nan_to_num(np.abs(nudged[name].astype(np.float64) - want64), nan=0.0)
        bound = RTOL * (np.abs(want64) + scale) + SENSITIVITY * sensitivity
        if not bool(np.all((error <= bound) | exact)):
            worst = np.nanmax(error) if got.size else 0.0
            return f"output {name} differs from the reference (max abs error {worst:.3g})"
    return None


def _bfloat16_mismatch(name: str, got: np.ndarray, want: np.ndarray, feeds: Mapping[str, np.ndarray]) -> str | None:
    """Why a bfloat16 output is wrong: beyond one bfloat16 step of the reference's value plus RTOL of the scale
    (NaN where it has NaN, infinities equal)."""
    got64, want64 = got.astype(np.float64), want.astype(np.float64)
    scale = _scale(want64, feeds.values())
    with np.errstate(invalid="ignore"):
        error = np.abs(got64 - want64)
        exact = (np.isnan(got64) & np.isnan(want64)) | (got64 == want64)
        step = np.ldexp(1.0, np.frexp(want64)[1] - BF16_BITS)  # frexp: |want| in [2^(e-1), 2^e)
        near = error <= step + RTOL * (np.abs(want64) + scale)
    if bool(np.all(near | exact)):
        return None
    worst = float(np.max(np.where(exact, 0.0, error))) if got.size else 0.0  # NaN: a NaN for a number
    return f"output {name} differs from the reference by more than a bfloat16 step (max abs error {worst:.3g})"


def _nudged(feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Float inputs each moved by a seeded relative NUDGE: how far that moves the reference bounds how far a
    correct float32 kernel's rounding may (an ill-conditioned output, x / Σx with Σx near 0, moves a lot)."""
    rng = np.random.default_rng(0)
    return {name: (values * (1 + NUDGE * rng.uniform(-1, 1, values.shape))).astype(values.dtype)
            if np.issubdtype(values.dtype, np.floating) else values for name, values in feeds.items()}  # fmt: skip


def _scale(output: np.ndarray, operands: Iterable[np.ndarray]) -> float:
    """The largest magnitude among the output and the float or bfloat16 operands. A kernel may have none of the
    latter — only integer or boolean inputs, only constants (no inputs at all), empty tensors — and then its
    output alone sets the scale (found by a bf16 plan of a transformer whose kernel had no float feed)."""
    return max([_magnitude(output), *(_magnitude(values) for values in operands)])


def _magnitude(values: np.ndarray) -> float:
    """The largest finite magnitude below SENTINEL (0 for none): a float kernel's rounding scales with its
    operands, and a sum of normalized values (a layer norm's Σ (x - mean)/std, near 0 by construction) is exact
    only to theirs. A mask's -3.4e38 is no operand's scale: counted, it let every other element be off by 3e34."""
    if values.dtype.name == "bfloat16":  # not a numpy floating type: its values as float64
        values = values.astype(np.float64)
    if not np.issubdtype(values.dtype, np.floating):
        return 0.0
    magnitudes = np.abs(values.astype(np.float64, copy=False))
    return float(np.max(magnitudes[magnitudes < SENTINEL], initial=0.0))
