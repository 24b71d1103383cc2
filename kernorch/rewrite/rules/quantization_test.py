"""quantization-round-trip: a dequantization of what a quantization just wrote reads the rounded float values,
the same numbers (edge values: ties, saturation at both ends, NaN, ±inf), two primitives fewer; refused where the
round trip could change a value."""

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


MUTANTS = [
    here("a round trip through a narrower type's range dropped", "if float(low.min()) < bounds.min or "
         "float(high.max()) > bounds.max:", "if False:"),
    here("a fractional offset's round trip dropped", "if not (_whole(offset) and _whole(low) and _whole(high)):",
         "if not (_whole(low) and _whole(high)):"),
]
