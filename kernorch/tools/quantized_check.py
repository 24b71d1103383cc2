"""How `kernorch check` judges a quantized model's outputs: in quantization steps, and against the spread between
onnxruntime's own two executions of the same file.

A quantized model's result is defined only up to where its roundings land: a float32 ulp before a quantizer moves a
value across a step boundary, and the step then travels through every later layer. onnxruntime itself runs such a
file two ways, its int8 kernels (graph optimizations on: QDQ fused into integer products) and the float arithmetic
the ONNX operators define (optimizations off), and those differ: by 2.4e-2 of the output's range on a static-QDQ
bert_mini, 1e-4 on a dynamic one. kernorch, between the two (integer sums as onnxruntime's kernels, float epilogues
as the operators), may differ from the int8 run by as much again: the tolerance is the larger of the fixed quantized
one and twice that spread. Where an output is itself dequantized from int8 (a DequantizeLinear with a constant scale
per tensor), its differences are whole steps: counted (equal, one step, more).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

SPREAD_FACTOR = 2.0  # kernorch may be as far from the int8 run as the float run is, and that again (triangle)


def widened(rtol: float, spread: float) -> float:
    """The tolerance of a quantized model's outputs: `rtol`, or twice onnxruntime's own int8-to-float spread."""
    return max(rtol, SPREAD_FACTOR * spread)


@dataclass(frozen=True)
class StepCounts:
    """How many elements of an output dequantized from int8 equal onnxruntime's, differ by one step, or more."""

    step: float
    equal: int
    one: int
    more: int

    def describe(self) -> str:
        total = self.equal + self.one + self.more
        return f"{self.equal} of {total} elements equal onnxruntime's, {self.one} one step ({self.step:.3g}) apart, " \
            f"{self.more} more"  # fmt: skip


def output_steps(proto: onnx.ModelProto) -> dict[str, float]:
    """Each graph output that a DequantizeLinear with a constant per-tensor scale writes: that scale (its step)."""
    initializers = {tensor.name: tensor for tensor in proto.graph.initializer}
    producers = {out: node for node in proto.graph.node for out in node.output}
    steps = {}
    for output in proto.graph.output:
        node = producers.get(output.name)
        if node is None or node.op_type != "DequantizeLinear" or node.input[1] not in initializers:
            continue
        scale = numpy_helper.to_array(initializers[node.input[1]])
        if scale.size == 1 and float(scale.reshape(-1)[0]) > 0:
            steps[output.name] = float(scale.reshape(-1)[0])
    return steps


def step_counts(actual: np.ndarray, expected: np.ndarray, step: float) -> StepCounts:
    """The elements' differences in whole steps (rounded: float32 dequantization leaves a fraction of an ulp)."""
    with np.errstate(invalid="ignore"):
        steps = np.rint(np.abs(actual.astype(np.float64) - expected.astype(np.float64)) / step)
    steps = np.where(np.isnan(steps), np.inf, steps)
    return StepCounts(step, int(np.count_nonzero(steps == 0)), int(np.count_nonzero(steps == 1)),
                      int(np.count_nonzero(steps > 1)))  # fmt: skip
