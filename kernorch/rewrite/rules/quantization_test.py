"""quantization-round-trip: a dequantization of what a quantization just wrote reads the rounded float values,
the same numbers (edge values: ties, saturation at both ends, NaN, ±inf), two primitives fewer; refused where the
round trip could change a value. requantization-same-grid: a quantization of a dequantized value on the same grid
is the first quantization's value; refused on another grid, offset, narrower bounds, or subnormal products."""

from __future__ import annotations

import numpy as np
import pytest

from kernorch.devtools.mutate import here
from kernorch.ir.graph import Graph
from kernorch.runtime import run_reference
from kernorch.testing.rewrite import build, emit, prims, rewrite_with

EDGES = np.array([0.5, 1.5, 2.5, -0.5, -2.5, 126.5, 127.5, -128.5, 1e6, -1e6, 0.0, -0.0, np.inf, -np.inf, np.nan,
                  300.0, -3.2], np.float32)  # fmt: skip


def _qdq(target: str, offset: float, low: float, high: float) -> Graph:
    """x / 0.5 quantized to `target` with these offset and bounds, dequantized (cast back, minus the offset,
    times the scale), as the QuantizeLinear and DequantizeLinear rules write it."""
    def body(b):  # type: ignore[no-untyped-def]
        scale, zero = b.constant(np.asarray(0.5, np.float32)), b.constant(np.asarray(offset, np.float32))
        step = emit(b, "saturating_round", emit(b, "div", "x", scale), zero,
                    b.constant(np.asarray(low, np.float32)), b.constant(np.asarray(high, np.float32)))
        value = emit(b, "cast", emit(b, "cast", step, to=target), to="float32")
        return emit(b, "mul", emit(b, "sub", value, zero), scale)

    return build({"x": EDGES.shape}, body)


def _same(before: Graph, after: Graph) -> None:
    feeds = {"x": EDGES}
    want, got = run_reference(before, feeds), run_reference(after, feeds)
    for name in before.outputs:
        np.testing.assert_array_equal(got[name], want[name])


@pytest.mark.parametrize(("target", "offset", "low", "high"), [
    ("int8", 3.0, -128.0, 127.0), ("uint8", 128.0, 0.0, 255.0), ("int16", -7.0, -32768.0, 32767.0),
])  # fmt: skip
def test_the_round_trip_cast_goes(target: str, offset: float, low: float, high: float) -> None:
    graph = _qdq(target, offset, low, high)
    rewritten, fired = rewrite_with(graph, "quantization-round-trip")
    assert fired == ["quantization-round-trip"] and "cast" not in prims(rewritten)
    _same(graph, rewritten)


@pytest.mark.parametrize(("target", "offset", "low", "high", "why"), [
    ("int8", 0.5, -128.0, 127.0, "an offset that is not whole: the cast would truncate it"),
    ("int8", 0.0, -128.0, 255.0, "bounds beyond int8: the cast would wrap"),
    ("uint8", 0.0, -1.0, 255.0, "bounds below uint8's"),
])  # fmt: skip
def test_a_round_trip_that_could_change_a_value_stays(target: str, offset: float, low: float, high: float,
                                                      why: str) -> None:  # fmt: skip
    graph = _qdq(target, offset, low, high)
    rewritten, fired = rewrite_with(graph, "quantization-round-trip")
    assert fired == [], why
    assert prims(rewritten).count("cast") == 2


def _requantized(scale: float = 0.0135755, second_scale: float | None = None, offset: float = 4.0,
                 second_offset: float | None = None, bounds: tuple[float, float] = (-128.0, 127.0),
                 second_bounds: tuple[float, float] | None = None, centre: str = "add") -> Graph:  # fmt: skip
    """x quantized (x / 0.5, rounded with `offset`, within `bounds`), dequantized ((q − offset) · scale), quantized
    again (/ second_scale, the second offset and bounds) and dequantized: a QDQ model's pair around an identity."""
    def body(b):  # type: ignore[no-untyped-def]
        def c(value: float) -> str:
            return b.constant(np.asarray(value, np.float32))  # type: ignore[no-any-return]

        def quantize(x: str, by: float, z: float, limits: tuple[float, float]) -> str:
            return emit(b, "saturating_round", emit(b, "div", x, c(by)), c(z), c(limits[0]), c(limits[1]))

        def dequantize(q: str, z: float, by: float) -> str:
            centred = emit(b, "add", q, c(-z)) if centre == "add" else emit(b, "sub", q, c(z))
            return emit(b, "mul", centred, c(by))

        first = dequantize(quantize("x", 0.5, offset, bounds), offset, scale)
        again = second_offset if second_offset is not None else offset
        return dequantize(quantize(first, second_scale or scale, again, second_bounds or bounds), again, scale)

    return build({"x": (EDGES.size + 600,)}, body)


def _values() -> np.ndarray:
    """The edge values and 600 more across and beyond the grid's range."""
    return np.concatenate([EDGES, np.linspace(-300, 300, 600, dtype=np.float32)])


@pytest.mark.parametrize("change", [dict(), dict(centre="sub"), dict(scale=3.7e-5, offset=-7.0),
                                    dict(bounds=(0.0, 255.0), offset=128.0), dict(scale=1e-30),
                                    dict(second_bounds=(-32768.0, 32767.0))])  # fmt: skip
def test_a_requantization_on_the_same_grid_goes(change: dict[str, object]) -> None:
    graph = _requantized(**change)  # type: ignore[arg-type]
    rewritten, fired = rewrite_with(graph, "requantization-same-grid")
    assert fired == ["requantization-same-grid"] and prims(rewritten).count("saturating_round") == 1
    assert prims(rewritten).count("div") == 1  # the first quantizer's
    feeds = {"x": _values()}
    np.testing.assert_array_equal(run_reference(rewritten, feeds)[rewritten.outputs[0]],
                                  run_reference(graph, feeds)[graph.outputs[0]])  # fmt: skip


@pytest.mark.parametrize(("change", "why"), [
    (dict(second_scale=0.0135756), "another scale: a requantization onto another grid"),
    (dict(second_offset=5.0), "another offset: every value moves by one"),
    (dict(second_bounds=(-100.0, 127.0)), "a higher lower bound: it saturates"),
    (dict(second_bounds=(-128.0, 100.0)), "a lower upper bound: it saturates"),
    (dict(scale=1e-35), "a scale whose products are subnormal: the quotient need not round back"),
])  # fmt: skip
def test_a_requantization_that_could_change_a_value_stays(change: dict[str, object], why: str) -> None:
    graph = _requantized(**change)  # type: ignore[arg-type]
    _, fired = rewrite_with(graph, "requantization-same-grid")
    assert fired == [], why


MUTANTS = [
    here("a round trip through a narrower type's range dropped", "if float(low.min()) < bounds.min or "
         "float(high.max()) > bounds.max:", "if False:"),
    here("a requantization onto a higher lower bound dropped",
         "    if float(np.max(low)) > float(np.min(first_low)) or float(np.min(high)) < float(np.max(first_high)):",
         "    if float(np.min(high)) < float(np.max(first_high)):", file="kernorch/rewrite/rules/quantization.py"),
    here("a requantization by another offset dropped",
         "    if not _same(shift, -offset if centred.prim == \"add\" else offset):  # (q − z) + z: q",
         "    if False:", file="kernorch/rewrite/rules/quantization.py"),
    here("a requantization of subnormal products dropped",
         "    if not _SCALE_RANGE[0] <= magnitude <= _SCALE_RANGE[1]:",
         "    if not 0 < magnitude:", file="kernorch/rewrite/rules/quantization.py"),
    here("a fractional offset's round trip dropped", "if not (_whole(offset) and _whole(low) and _whole(high)):",
         "if not (_whole(low) and _whole(high)):"),
]
