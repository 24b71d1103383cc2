"""Where kernorch's run of a quantized model leaves onnxruntime's, and who rounded right there.

A quantizer rounds x / scale to an integer. Where the exact x / scale lies a float32 ulp from a rounding boundary
(k + ½), the order in which the sum before it was accumulated decides the step, and every later layer carries
the difference, widening it. onnxruntime on x86 runs a convolution of int8 activations in float32 (its QDQ fusion
to QLinearConv takes uint8 activations only), so its sums round; kernorch's are integer sums, exact. Two runs that
are both right can then end several percent apart (hrnet_w18_small: onnxruntime with one thread and with two
differ by 2.3e-2), so a quantized model whose outputs differ by more than the check's tolerance is arbitrated,
quantizer by quantizer:

1. every QuantizeLinear's integers, kernorch's (its reference interpreter, whose outputs must equal the checked
   ones bit for bit) against onnxruntime's;
2. a quantizer that differs while every quantizer it is computed from agrees is evaluated exactly: its producing
   operators in float64 (onnx.reference), from the shared integers upstream, at each differing element. kernorch's
   integer must be the exact value's rounding, or the exact value must lie within NEAR_TIE_STEPS of a boundary
   (float32 arithmetic may round it either way); anything else is a wrong answer, named with an element;
3. onnxruntime is given kernorch's integers there in place of its own and runs again, until no quantizer differs;
   its outputs must then agree with kernorch's to the tolerance (the float operators after the last quantizer).

So a divergence excuses nothing after it: each later one is judged on its own, from agreed inputs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

# A float32 sum of up to ~10^4 products of at most a few hundred steps lands within ~1e-4 of a step of the exact
# value; a wrong scale or zero point lands uniformly in [0, ½) from a boundary, here with probability 2e-3 per
# element (and every differing element of a quantizer must pass)
NEAR_TIE_STEPS = 1e-3
MAX_ROUNDS = 64  # onnxruntime re-runs with kernorch's integers given: one per wave of divergences
MAX_PRODUCERS = 64  # operators between a quantizer and the integers it is computed from, evaluated in float64
DEFAULT_DOMAINS = ("", "ai.onnx")


@dataclass(frozen=True)
class QuantizerDivergence:
    """One quantizer whose integers differ from onnxruntime's, given the same integers upstream."""

    quantizer: str  # the QuantizeLinear node's name (its output where it has none)
    differing: int
    size: int
    exact: int  # of the differing elements: kernorch's integer is the exact value's rounding
    near_tie: int  # of the others: the exact value lies within NEAR_TIE_STEPS of a rounding boundary
    example: str  # the first differing element: its exact x / scale, kernorch's and onnxruntime's integers

    @property
    def explained(self) -> bool:
        return self.exact + self.near_tie == self.differing

    def describe(self) -> str:
        wrong = self.differing - self.exact - self.near_tie
        verdict = f", {wrong} WRONG" if wrong else ""
        return f"{self.quantizer}: {self.differing} of {self.size} differ; kernorch rounds the exact value " \
            f"right at {self.exact}, {self.near_tie} within {NEAR_TIE_STEPS:g} step of a tie{verdict} " \
            f"({self.example})"  # fmt: skip


@dataclass(frozen=True)
class Arbitration:
    """The quantizers where kernorch and onnxruntime part, each judged in exact arithmetic, and how far the
    outputs are apart once onnxruntime is given kernorch's integers there."""

    divergences: tuple[QuantizerDivergence, ...] = ()
    remaining: float | None = None  # relative error of the outputs then (None: not reached)
    rtol: float = 0.0
    reason: str = ""  # why the arbitration could not finish ("" when it did)

    @property
    def explained(self) -> bool:
        """Every divergence is kernorch's exact rounding or a tie, and the outputs then agree."""
        return not self.reason and all(d.explained for d in self.divergences) and self.remaining is not None \
            and self.remaining <= self.rtol  # fmt: skip

    def lines(self) -> list[str]:
        if self.reason:
            return [f"  not arbitrated: {self.reason}"]
        elements = sum(d.differing for d in self.divergences)
        out = [f"  arbitrated in exact arithmetic: {len(self.divergences)} quantizer(s) differ from onnxruntime's "
               f"({elements} elements)"]  # fmt: skip
        shown = [d for d in self.divergences if not d.explained][:5] or list(self.divergences[:3])
        out += [f"    {d.describe()}" for d in shown]
        if len(self.divergences) > len(shown):
            out.append(f"    ... and {len(self.divergences) - len(shown)} more")
        if self.remaining is not None:
            out.append(f"  with kernorch's integers there, onnxruntime's outputs differ by {self.remaining:.3e}")
        return out


class _Model:
    """The quantized model's producers, constants and quantizers, and the models the arbitration runs."""

    def __init__(self, proto: onnx.ModelProto) -> None:
        self.proto = proto
        self.constants = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
        self.producers = {out: node for node in proto.graph.node for out in node.output if out}
        self.inputs = {i.name for i in proto.graph.input} - set(self.constants)
        inferred = onnx.shape_inference.infer_shapes(proto)
        infos = {v.name: v for v in (*inferred.graph.value_info, *inferred.graph.output)}
        # the quantizers whose integers are compared: every QuantizeLinear whose output type shape inference knows
        self.quantizers = [node for node in proto.graph.node if node.op_type == "QuantizeLinear"
                           and node.domain in DEFAULT_DOMAINS and node.output[0] in infos]  # fmt: skip
        self.infos = {node.output[0]: infos[node.output[0]] for node in self.quantizers}

    def cut(self, given: Sequence[str] = ()) -> onnx.ModelProto:
        """The model with every quantizer's integers an output, and the quantizers writing `given` removed (their
        integers then graph inputs)."""
        cut = onnx.ModelProto()
        cut.CopyFrom(self.proto)
        given_set = set(given)
        kept = [node for node in cut.graph.node
                if not (node.op_type == "QuantizeLinear" and node.output[0] in given_set)]  # fmt: skip
        del cut.graph.node[:]
        cut.graph.node.extend(kept)
        cut.graph.input.extend(self.infos[name] for name in given)
        outputs = {o.name for o in cut.graph.output}
        cut.graph.output.extend(self.infos[q.output[0]] for q in self.quantizers
                                if q.output[0] not in given_set and q.output[0] not in outputs)  # fmt: skip
        return cut

    def producing(self, value: str, known: Mapping[str, np.ndarray]) -> tuple[list[onnx.NodeProto], set[str]] | None:
        """The operators computing `value` from known integers, constants and inputs (in graph order), and the
        quantizer outputs they read; None when more than MAX_PRODUCERS."""
        order = {id(node): i for i, node in enumerate(self.proto.graph.node)}
        nodes: dict[int, onnx.NodeProto] = {}
        read: set[str] = set()
        pending = [value]
        while pending:
            name = pending.pop()
            node = self.producers.get(name)
            if not name or node is None or id(node) in nodes:
                continue
            nodes[id(node)] = node
            if len(nodes) > MAX_PRODUCERS:
                return None
            for source in node.input:
                if source in known and source not in self.constants and source not in self.inputs:
                    read.add(source)  # a quantizer's integers: where the walk stops
                elif source not in self.constants and source not in self.inputs:
                    pending.append(source)
        return sorted(nodes.values(), key=lambda n: order[id(n)]), read


def _float64(array: np.ndarray) -> np.ndarray:
    return array.astype(np.float64) if array.dtype.kind == "f" else array


def _dequantized(node: onnx.NodeProto, values: Mapping[str, np.ndarray]) -> np.ndarray | None:
    """DequantizeLinear `node` in float64 where its inputs are all in `values` (None otherwise, or when blocked)."""
    attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    sources = [values.get(name) if name else None for name in node.input]
    if sources[0] is None or len(sources) < 2 or sources[1] is None or attributes.get("block_size", 0) \
            or len(sources) > 2 and node.input[2] and sources[2] is None:  # fmt: skip
        return None
    integers, scale = sources[0], sources[1]
    zero = sources[2] if len(sources) > 2 and sources[2] is not None else np.zeros(())
    shape = [1] * integers.ndim
    if scale.size != 1:
        shape[int(attributes.get("axis", 1)) % integers.ndim] = scale.size

    def along(parameter: np.ndarray) -> np.ndarray:
        return parameter.astype(np.float64).reshape(shape if parameter.size != 1 else ())

    return (integers.astype(np.float64) - along(zero)) * along(scale)


def _exactly(model: _Model, nodes: Sequence[onnx.NodeProto], value: str, feeds: Mapping[str, np.ndarray],
             integers: Mapping[str, np.ndarray]) -> np.ndarray:  # fmt: skip
    """`value` computed by `nodes` in float64: their dequantizations of known integers here, the rest by
    onnx.reference with every float constant and input widened."""
    from onnx.reference import ReferenceEvaluator

    values: dict[str, np.ndarray] = {**model.constants, **feeds, **integers}
    rest = []
    for node in nodes:
        dequantized = _dequantized(node, values) if node.op_type == "DequantizeLinear" else None
        if dequantized is None:
            rest.append(node)
        else:
            values[node.output[0]] = dequantized
    if not rest:
        return values[value]
    read = {source for node in rest for source in node.input if source}
    produced = {out for node in rest for out in node.output}
    inputs = {name: _float64(np.asarray(values[name])) for name in read - produced if name not in model.constants}
    initializers = [numpy_helper.from_array(_float64(model.constants[name]), name) for name in sorted(read - produced)
                    if name in model.constants]  # fmt: skip
    graph = helper.make_graph(
        rest, "exact",
        [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(array.dtype), array.shape)
         for name, array in inputs.items()],
        [helper.make_tensor_value_info(value, onnx.TensorProto.DOUBLE, None)], initializers)  # fmt: skip
    exact = helper.make_model(graph, opset_imports=model.proto.opset_import, ir_version=model.proto.ir_version)
    results = ReferenceEvaluator(exact).run([value], inputs)  # a list unless `intermediate`
    assert isinstance(results, list)
    return np.asarray(results[0], np.float64)


def _judge(model: _Model, quantizer: onnx.NodeProto, x: np.ndarray, mine: np.ndarray,
           theirs: np.ndarray) -> QuantizerDivergence | str:  # fmt: skip
    """The quantizer's differing elements judged against x / scale computed exactly (or why they cannot be)."""
    attributes = {a.name: helper.get_attribute_value(a) for a in quantizer.attribute}
    scale = model.constants.get(quantizer.input[1])
    zero = model.constants.get(quantizer.input[2]) if len(quantizer.input) > 2 and quantizer.input[2] else None
    if scale is None or attributes.get("block_size", 0):
        return f"{quantizer.name}: its scale is not a constant per tensor or per axis"
    if mine.dtype.kind not in "iu":
        return f"{quantizer.name}: it quantizes to {mine.dtype}, not to integers"
    shape = [1] * x.ndim
    if scale.size != 1:
        shape[int(attributes.get("axis", 1)) % x.ndim] = scale.size
    steps = x / scale.astype(np.float64).reshape(shape if scale.size != 1 else ())
    offset = np.zeros(()) if zero is None else zero.astype(np.float64).reshape(shape if zero.size != 1 else ())
    bounds = np.iinfo(mine.dtype)
    exact = np.clip(np.rint(steps) + offset, bounds.min, bounds.max)
    differing = np.flatnonzero(mine.reshape(-1) != theirs.reshape(-1))
    right = mine.reshape(-1)[differing] == exact.reshape(-1)[differing]
    fraction = steps.reshape(-1)[differing] - np.floor(steps.reshape(-1)[differing])
    tie = np.abs(fraction - 0.5) <= NEAR_TIE_STEPS
    first = int(differing[0])
    example = f"element {first}: exact x/scale {steps.reshape(-1)[first]:.7f}, kernorch {mine.reshape(-1)[first]}, " \
        f"onnxruntime {theirs.reshape(-1)[first]}"  # fmt: skip
    return QuantizerDivergence(quantizer.name or quantizer.output[0], int(differing.size), int(mine.size),
                               int(np.count_nonzero(right)), int(np.count_nonzero(tie & ~right)), example)  # fmt: skip


Runner = Callable[[onnx.ModelProto, Mapping[str, np.ndarray]], dict[str, np.ndarray]]


Worst = Callable[[Mapping[str, np.ndarray], Mapping[str, np.ndarray]], float]


def arbitrate(proto: onnx.ModelProto, feeds: Mapping[str, np.ndarray], actual: Mapping[str, np.ndarray],
              rtol: float, kernorch: Runner, onnxruntime: Runner, compare: Worst) -> Arbitration:  # fmt: skip
    """Arbitrate `actual` (kernorch's outputs of `proto` on `feeds`) against onnxruntime (module docstring).
    `kernorch` runs a model with its reference interpreter, `onnxruntime` with its int8 kernels; `compare` gives the
    worst relative error of outputs against expected ones."""
    model = _Model(proto)
    if not model.quantizers:
        return Arbitration(rtol=rtol, reason="no QuantizeLinear whose integers can be compared")
    cut = model.cut()
    mine = kernorch(cut, feeds)
    outputs = [o.name for o in proto.graph.output]
    if any(not np.array_equal(mine[name], actual[name], equal_nan=True) for name in outputs):
        return Arbitration(rtol=rtol, reason="the checked outputs differ from kernorch's reference interpreter's")
    names = [q.output[0] for q in model.quantizers]
    divergences: list[QuantizerDivergence] = []
    given: dict[str, np.ndarray] = {}
    for _ in range(MAX_ROUNDS):
        theirs = onnxruntime(model.cut(list(given)), {**feeds, **given})
        differing = {name for name in names if name not in given and not np.array_equal(mine[name], theirs[name])}
        if not differing:
            return Arbitration(tuple(divergences), compare({n: actual[n] for n in outputs},
                                                           {n: theirs[n] for n in outputs}), rtol)  # fmt: skip
        known = {name: mine[name] for name in names}
        for quantizer in model.quantizers:
            name = quantizer.output[0]
            if name not in differing:
                continue
            walk = model.producing(quantizer.input[0], known)
            if walk is None:
                return Arbitration(tuple(divergences), None, rtol, f"{quantizer.name} is computed by more than "
                                   f"{MAX_PRODUCERS} operators from the integers before it")  # fmt: skip
            nodes, read = walk
            if read & differing:
                continue  # judged once its inputs agree
            try:
                x = _exactly(model, nodes, quantizer.input[0], feeds, {n: known[n] for n in read})
            except Exception as error:  # onnx.reference raises what numpy and its operators raise
                return Arbitration(tuple(divergences), None, rtol, f"{quantizer.name} cannot be evaluated in float64 "
                                   f"by onnx.reference ({type(error).__name__}: {str(error)[:120]})")  # fmt: skip
            judged = _judge(model, quantizer, x, mine[name], theirs[name])
            if isinstance(judged, str):
                return Arbitration(tuple(divergences), None, rtol, judged)
            divergences.append(judged)
            given[name] = mine[name]
    return Arbitration(tuple(divergences), None, rtol, f"quantizers still differ after {MAX_ROUNDS} rounds")
