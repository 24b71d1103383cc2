"""Where kernorch's run of a quantized model leaves onnxruntime's, and who rounded right there.

A quantizer rounds x / scale to an integer. Where the exact x / scale lies a float32 ulp from a rounding boundary
(k + ½), the order in which the sum before it was accumulated decides the step, and every later layer carries
the difference, widening it. onnxruntime on x86 runs a convolution of int8 activations in float32 (its QDQ fusion
to QLinearConv takes uint8 activations only), so its sums round; kernorch's are integer sums, exact. Two runs that
are both right can then end several percent apart (hrnet_w18_small: onnxruntime with one thread and with two
differ by 2.3e-2), so a quantized model whose outputs differ by more than the check's tolerance is arbitrated,
quantizer by quantizer:

1. every quantizer's results (QuantizeLinear's integers; DynamicQuantizeLinear's with their scale and zero point),
   kernorch's against onnxruntime's. kernorch runs the model as the check did, with every quantizer's results
   among its outputs: by its reference interpreter, or compiled (a plan of that model, which keeps them in
   memory; its outputs must equal the checked plan's within the tolerance, and equal them bit for bit where the
   extra outputs changed no kernel's arithmetic);
2. a quantizer that differs while every quantizer it is computed from agrees is evaluated exactly: its producing
   operators in float64 (onnx.reference), from the shared integers upstream, at each differing element. kernorch's
   integer must be the exact value's rounding, or the exact value must lie within NEAR_TIE_STEPS (or FLOAT_RTOL of
   its magnitude, what kernorch's float kernels are held to) of a boundary
   (float32 arithmetic may round it either way); anything else is a wrong answer, named with an element;
3. onnxruntime is given kernorch's integers there in place of its own and runs again, until no quantizer differs;
   its outputs must then agree with kernorch's to the tolerance (the float operators after the last quantizer) —
   or, where they do not, kernorch's must agree with those operators evaluated in float64 from kernorch's integers
   (onnxruntime's own byte products saturate on a CPU without VNNI: efficientnet_b0.dynamic's classifier, 1.3e-1).

So a divergence excuses nothing after it: each later one is judged on its own, from agreed inputs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from kernorch.errors import KernorchError
from kernorch.tools.qoperator_expansion import expanded

# A float32 sum of up to ~10^4 products of at most a few hundred steps lands within ~1e-4 of a step of the exact
# value; a wrong scale or zero point lands uniformly in [0, ½) from a boundary, here with probability 2e-3 per
# element (and every differing element of a quantizer must pass)
NEAR_TIE_STEPS = 1e-3
# kernorch's float kernels are held to 1e-4 relative (check's float32 tolerance): a compiled instance norm over
# 50k values lands 2e-5 from exact (candy: x/scale 180.4965 rounded up). A value within that much of its own
# magnitude from a boundary may round either way; a dynamic quantizer's scale, the range of such values over 255,
# is as far from exact
FLOAT_RTOL = 1e-4
MAX_ROUNDS = 64  # onnxruntime re-runs with kernorch's integers given: one per wave of divergences
MAX_PRODUCERS = 4096  # operators evaluated in float64 for one quantizer (each once per arbitration)
DEFAULT_DOMAINS = ("", "ai.onnx")
QUANTIZERS = frozenset({"QuantizeLinear", "DynamicQuantizeLinear"})


@dataclass(frozen=True)
class QuantizerDivergence:
    """One quantizer whose integers differ from onnxruntime's, given the same integers upstream."""

    quantizer: str  # the QuantizeLinear node's name (its output where it has none)
    differing: int
    size: int
    exact: int  # of the differing elements: kernorch's integer is the exact value's rounding
    near_tie: int  # of the others: the exact value lies within NEAR_TIE_STEPS (FLOAT_RTOL) of a rounding boundary
    example: str  # the first differing element: its exact x / scale, kernorch's and onnxruntime's integers

    @property
    def explained(self) -> bool:
        return self.exact + self.near_tie == self.differing

    def describe(self) -> str:
        wrong = self.differing - self.exact - self.near_tie
        verdict = f", {wrong} WRONG" if wrong else ""
        return f"{self.quantizer}: {self.differing} of {self.size} differ; kernorch rounds the exact value " \
            f"right at {self.exact}, {self.near_tie} within float rounding of a tie{verdict} " \
            f"({self.example})"  # fmt: skip


@dataclass(frozen=True)
class Arbitration:
    """The quantizers where kernorch and onnxruntime part, each judged in exact arithmetic, and how far the
    outputs are apart once onnxruntime is given kernorch's integers there."""

    divergences: tuple[QuantizerDivergence, ...] = ()
    remaining: float | None = None  # relative error of the outputs then (None: not reached)
    rtol: float = 0.0
    reason: str = ""  # why the arbitration could not finish ("" when it did)
    plan_error: float = 0.0  # relative error of the checked outputs against the arbitrated run's
    # where onnxruntime's outputs stay apart: kernorch's against the operators after the quantizers evaluated in
    # float64 from its integers (onnxruntime's own byte products saturate without VNNI), None when not needed
    exact_remaining: float | None = None

    @property
    def explained(self) -> bool:
        """Every divergence is kernorch's exact rounding or a tie, the outputs then agree, and the checked outputs
        are the interpreter's to the tolerance."""
        return not self.reason and all(d.explained for d in self.divergences) and self.remaining is not None \
            and min(self.remaining, math.inf if self.exact_remaining is None else self.exact_remaining) <= self.rtol \
            and self.plan_error <= self.rtol  # fmt: skip

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
        if self.exact_remaining is not None:
            out.append(f"  and the operators after them, evaluated exactly from those integers, by "
                       f"{self.exact_remaining:.3e}")  # fmt: skip
        if self.plan_error:
            out.append(f"  the checked outputs differ from the arbitrated run's (every quantizer's results kept) by "
                       f"{self.plan_error:.3e}")
        return out


class _Model:
    """The quantized model's producers, constants and quantizers, and the models the arbitration runs. `proto` is
    run (cut, by onnxruntime and kernorch); `exact`, its QOperator nodes written out as dequantization, float
    operator and quantizer (qoperator_expansion.py), is what is evaluated and whose quantizers are judged."""

    def __init__(self, proto: onnx.ModelProto) -> None:
        self.proto = proto
        self.exact = expanded(proto)
        self.constants = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
        self.producers = {out: node for node in self.exact.graph.node for out in node.output if out}
        self.order = {id(node): i for i, node in enumerate(self.exact.graph.node)}  # graph order, by node
        self.inputs = {i.name for i in proto.graph.input} - set(self.constants)
        inferred = onnx.shape_inference.infer_shapes(self.exact)
        infos = {v.name: v for v in (*inferred.graph.value_info, *inferred.graph.output)
                 if v.type.tensor_type.HasField("shape")}  # fmt: skip
        # the quantizers whose results are compared: every one whose outputs' types and shapes inference knows
        self.quantizers = [node for node in self.exact.graph.node
                           if node.op_type in QUANTIZERS and node.domain in DEFAULT_DOMAINS
                           and all(o in infos for o in node.output if o)]  # fmt: skip
        self.infos = {out: infos[out] for node in self.quantizers for out in node.output if out}

    def cut(self, given: Collection[str] = ()) -> onnx.ModelProto:
        """The model with every quantizer's results an output, and the nodes writing `given` removed (their
        results then graph inputs)."""
        cut = onnx.ModelProto()
        cut.CopyFrom(self.proto)
        removed = [q for q in self.quantizers if q.output[0] in given]
        kept = [node for node in cut.graph.node if node.output[0] not in given]
        del cut.graph.node[:]
        cut.graph.node.extend(kept)
        cut.graph.input.extend(self.infos[out] for q in removed for out in q.output if out)
        outputs = {o.name for o in cut.graph.output}
        cut.graph.output.extend(self.infos[out] for q in self.quantizers if q.output[0] not in given
                                for out in q.output if out and out not in outputs)  # fmt: skip
        return cut

    def upstream(self) -> dict[str, frozenset[str]]:
        """Each value's quantizer results it is computed from without another quantizer between (a residual
        sum in float reaches back through every block)."""
        results = {out for q in self.quantizers for out in q.output if out}
        depends: dict[str, frozenset[str]] = {}
        for node in self.exact.graph.node:
            reads = frozenset().union(*({v} if v in results else depends.get(v, frozenset()) for v in node.input))
            depends.update((out, reads) for out in node.output if out)
        return depends

    def needed(self, value: str, available: Collection[str]) -> list[onnx.NodeProto]:
        """The operators computing `value` from what is `available` (and constants and inputs), in graph order."""
        nodes: dict[int, onnx.NodeProto] = {}
        pending = [value]
        while pending:
            name = pending.pop()
            node = self.producers.get(name)
            if not name or node is None or id(node) in nodes or name in available:
                continue
            nodes[id(node)] = node
            pending.extend(v for v in node.input if v not in self.constants and v not in self.inputs)
        return sorted(nodes.values(), key=lambda n: self.order[id(n)])


def _float64(array: np.ndarray) -> np.ndarray:
    return array.astype(np.float64) if array.dtype.kind == "f" else array


FLOATS = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)


def _widened(node: onnx.NodeProto) -> onnx.NodeProto:
    """`node` computing in float64 where it would make a narrower float: a Cast to float casts to double, a
    Constant or ConstantOfShape of floats holds doubles."""
    wide = onnx.NodeProto()
    wide.CopyFrom(node)
    for attribute in wide.attribute:
        if node.op_type == "Cast" and attribute.name == "to" and attribute.i in FLOATS:
            attribute.i = onnx.TensorProto.DOUBLE
        elif node.op_type in ("Constant", "ConstantOfShape") and attribute.type == onnx.AttributeProto.TENSOR \
                and attribute.t.data_type in FLOATS:  # fmt: skip
            doubles = _float64(numpy_helper.to_array(attribute.t))
            attribute.t.CopyFrom(numpy_helper.from_array(doubles, attribute.t.name))
    return wide


def _dequantized(node: onnx.NodeProto, sources: Sequence[np.ndarray | None]) -> np.ndarray:
    """DequantizeLinear `node` of known `sources` (its inputs' values) in float64."""
    attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if attributes.get("block_size", 0):
        raise ArbitrationRefused(f"{node.name} dequantizes by blocks")
    integers, scale = sources[0], sources[1]
    assert integers is not None and scale is not None
    zero = sources[2] if len(sources) > 2 and sources[2] is not None else np.zeros(())
    shape = [1] * integers.ndim
    if scale.size != 1:
        shape[int(attributes.get("axis", 1)) % integers.ndim] = scale.size

    def along(parameter: np.ndarray) -> np.ndarray:
        return parameter.astype(np.float64).reshape(shape if parameter.size != 1 else ())

    return (integers.astype(np.float64) - along(zero)) * along(scale)


class _Exact:
    """Values computed in float64 from kernorch's quantizer results, the inputs and the constants: each operator
    once per arbitration (a residual stream is evaluated once, not once per quantizer reading it)."""

    def __init__(self, model: _Model, feeds: Mapping[str, np.ndarray], results: Mapping[str, np.ndarray]) -> None:
        self.model = model
        self.values = {name: _float64(np.asarray(value)) for name, value in {**feeds, **results}.items()}

    def _value(self, name: str) -> np.ndarray:
        value = self.values.get(name)
        return _float64(self.model.constants[name]) if value is None else value

    def _evaluate(self, nodes: Sequence[onnx.NodeProto]) -> None:
        """Run `nodes` (graph order) by onnx.reference, floats widened (a Cast to float casts to double)."""
        from onnx.reference import ReferenceEvaluator

        if not nodes:
            return
        read = {source for node in nodes for source in node.input if source}
        produced = sorted({out for node in nodes for out in node.output if out})
        inputs = {name: self._value(name) for name in sorted(read - set(produced))}
        graph = helper.make_graph(
            [_widened(node) for node in nodes], "exact",
            [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(array.dtype), array.shape)
             for name, array in inputs.items()],
            [helper.make_tensor_value_info(out, onnx.TensorProto.UNDEFINED, None) for out in produced])  # fmt: skip
        evaluator = ReferenceEvaluator(helper.make_model(graph, opset_imports=self.model.exact.opset_import,
                                                         ir_version=self.model.exact.ir_version))  # fmt: skip
        results = evaluator.run(produced, inputs)  # a list unless `intermediate`
        assert isinstance(results, list)
        self.values.update((out, np.asarray(result)) for out, result in zip(produced, results, strict=True))

    def of(self, value: str) -> np.ndarray:
        """`value` in float64: dequantizations here, every other operator by onnx.reference."""
        nodes = self.model.needed(value, self.values)
        if len(nodes) > MAX_PRODUCERS:
            raise ArbitrationRefused(f"{value} is computed by {len(nodes)} operators (more than {MAX_PRODUCERS})")
        batch: list[onnx.NodeProto] = []
        for node in nodes:
            if node.op_type == "DequantizeLinear":  # here: onnx.reference has it only from opset 19
                self._evaluate(batch)
                batch = []
                self.values[node.output[0]] = _dequantized(node, [self._value(n) if n else None for n in node.input])
            else:
                batch.append(node)
        self._evaluate(batch)
        return np.asarray(self.values[value], np.float64)


class ArbitrationRefused(Exception):
    """A quantizer the arbitration cannot judge; the message says why."""


def _steps(quantizer: onnx.NodeProto, name: str, steps: np.ndarray, offset: np.ndarray, mine: np.ndarray,
           theirs: np.ndarray, parameters: tuple[int, int, int] = (0, 0, 0), note: str = "") -> QuantizerDivergence:
    """The quantizer's differing integers judged against steps (x / scale exactly) + offset; `parameters`: how many
    of its scale and zero point differ, and how many of them are exact or tied (a dynamic quantizer's)."""
    bounds = np.iinfo(mine.dtype)
    exact = np.clip(np.rint(steps) + offset, bounds.min, bounds.max).reshape(-1)
    differing = np.flatnonzero(mine.reshape(-1) != theirs.reshape(-1))
    right = mine.reshape(-1)[differing] == exact[differing]
    fraction = steps.reshape(-1)[differing] - np.floor(steps.reshape(-1)[differing])
    tie = np.abs(fraction - 0.5) <= np.maximum(NEAR_TIE_STEPS, FLOAT_RTOL * np.abs(steps.reshape(-1)[differing]))
    example = note
    if differing.size:  # the first wrong element, else the first differing one
        wrong = differing[~(right | tie)]
        first = int(wrong[0] if wrong.size else differing[0])
        example = "; ".join(filter(None, [f"element {first}: exact x/scale {steps.reshape(-1)[first]:.7f}, "
                                          f"kernorch {mine.reshape(-1)[first]}, onnxruntime "
                                          f"{theirs.reshape(-1)[first]}", note]))  # fmt: skip
    return QuantizerDivergence(name, int(differing.size) + parameters[0], int(mine.size),
                               int(np.count_nonzero(right)) + parameters[1],
                               int(np.count_nonzero(tie & ~right)) + parameters[2], example)  # fmt: skip


def _judge(model: _Model, quantizer: onnx.NodeProto, x: np.ndarray, mine: Sequence[np.ndarray],
           theirs: Sequence[np.ndarray]) -> QuantizerDivergence | str:  # fmt: skip
    """The quantizer's differing results judged against x computed exactly (or why they cannot be)."""
    name = quantizer.name or quantizer.output[0]
    if mine[0].dtype.kind not in "iu":
        return f"{name}: it quantizes to {mine[0].dtype}, not to integers"
    if quantizer.op_type == "DynamicQuantizeLinear":
        return _judge_dynamic(name, quantizer, x, mine, theirs)
    attributes = {a.name: helper.get_attribute_value(a) for a in quantizer.attribute}
    scale = model.constants.get(quantizer.input[1])
    zero = model.constants.get(quantizer.input[2]) if len(quantizer.input) > 2 and quantizer.input[2] else None
    if scale is None or attributes.get("block_size", 0):
        return f"{name}: its scale is not a constant per tensor or per axis"
    shape = [1] * x.ndim
    if scale.size != 1:
        shape[int(attributes.get("axis", 1)) % x.ndim] = scale.size
    steps = x / scale.astype(np.float64).reshape(shape if scale.size != 1 else ())
    offset = np.zeros(()) if zero is None else zero.astype(np.float64).reshape(shape if zero.size != 1 else ())
    return _steps(quantizer, name, steps, offset, mine[0], theirs[0])


def _judge_dynamic(name: str, quantizer: onnx.NodeProto, x: np.ndarray, mine: Sequence[np.ndarray],
                   theirs: Sequence[np.ndarray]) -> QuantizerDivergence:  # fmt: skip
    """DynamicQuantizeLinear: kernorch's scale within FLOAT_RTOL of (max(0, x) - min(0, x)) / 255 exactly, its zero
    point the rounding of -min(0, x) / its scale (or a tie), and its integers x / its scale rounded (or ties)."""
    low = min(0.0, float(x.min(initial=0.0)))
    exact_scale = (max(0.0, float(x.max(initial=0.0))) - low) / 255
    scale, zero = float(mine[1]), float(mine[2])
    scale_differs = float(theirs[1]) != scale
    scale_right = abs(scale - exact_scale) <= FLOAT_RTOL * exact_scale
    zero_steps = -low / scale if scale else 0.0
    zero_differs = float(theirs[2]) != zero
    zero_right = zero == np.clip(np.rint(zero_steps), 0, 255)
    zero_tie = abs(zero_steps - np.floor(zero_steps) - 0.5) <= max(NEAR_TIE_STEPS, FLOAT_RTOL * abs(zero_steps))
    # (how many of the two differ, how many of those are right, how many of the rest tied)
    parameters = (scale_differs + zero_differs, (scale_differs and scale_right) + (zero_differs and zero_right),
                  int(zero_differs and zero_tie and not zero_right))
    note = f"scale {scale:.9g} (onnxruntime {float(theirs[1]):.9g}, exact {exact_scale:.9g}), zero point {zero:g}"
    steps = x / scale if scale else np.zeros_like(x)
    return _steps(quantizer, name, steps, np.asarray(zero), mine[0], theirs[0], parameters, note)


Runner = Callable[[onnx.ModelProto, Mapping[str, np.ndarray]], dict[str, np.ndarray]]


Worst = Callable[[Mapping[str, np.ndarray], Mapping[str, np.ndarray]], float]


def arbitrate(proto: onnx.ModelProto, feeds: Mapping[str, np.ndarray], actual: Mapping[str, np.ndarray],
              rtol: float, kernorch: Runner, onnxruntime: Runner, compare: Worst) -> Arbitration:  # fmt: skip
    """Arbitrate `actual` (kernorch's outputs of `proto` on `feeds`) against onnxruntime (module docstring).
    `kernorch` runs a model with its reference interpreter, `onnxruntime` with its int8 kernels; `compare` gives the
    worst relative error of outputs against expected ones."""
    model = _Model(proto)
    if not model.quantizers:
        return Arbitration(rtol=rtol, reason="no quantizer whose results can be compared")
    try:
        mine = kernorch(model.cut(), feeds)
    except KernorchError as error:
        return Arbitration(rtol=rtol, reason=f"kernorch cannot run the model with its quantizers' results as outputs "
                                             f"({error})")  # fmt: skip
    outputs = [o.name for o in proto.graph.output]
    plan_error = compare({n: actual[n] for n in outputs}, {n: mine[n] for n in outputs})
    results = {q.output[0]: [out for out in q.output if out] for q in model.quantizers}
    exact = _Exact(model, feeds, {out: mine[out] for outs in results.values() for out in outs})
    upstream = model.upstream()
    divergences: list[QuantizerDivergence] = []
    given: dict[str, np.ndarray] = {}
    for _ in range(MAX_ROUNDS):
        try:
            theirs = onnxruntime(model.cut(given), {**feeds, **given})
        except KernorchError as error:
            return Arbitration(tuple(divergences), None, rtol, f"onnxruntime cannot run the model cut at its "
                               f"quantizers ({error})")  # fmt: skip
        differing = {out for first, outs in results.items() if first not in given
                     and any(not np.array_equal(mine[o], theirs[o]) for o in outs) for out in outs}  # fmt: skip
        if not differing:
            remaining = compare({n: mine[n] for n in outputs}, {n: theirs[n] for n in outputs})
            exact_remaining = None
            if remaining > rtol:  # onnxruntime's own products may be what parts them: the exact value decides
                try:
                    exact_remaining = compare({n: mine[n] for n in outputs}, {n: exact.of(n) for n in outputs})
                except Exception:  # too many operators (ArbitrationRefused), or what onnx.reference raises: undecided
                    pass
            return Arbitration(tuple(divergences), remaining, rtol, plan_error=plan_error,
                               exact_remaining=exact_remaining)  # fmt: skip
        for quantizer in model.quantizers:
            name = quantizer.output[0]
            if name not in differing or upstream.get(quantizer.input[0], frozenset()) & differing:
                continue  # agreeing, or judged once what it is computed from agrees
            try:
                x = exact.of(quantizer.input[0])
            except ArbitrationRefused as refused:
                return Arbitration(tuple(divergences), None, rtol, f"{quantizer.name}: {refused}")
            except Exception as error:  # onnx.reference raises what numpy and its operators raise
                return Arbitration(tuple(divergences), None, rtol, f"{quantizer.name} cannot be evaluated in float64 "
                                   f"by onnx.reference ({type(error).__name__}: {str(error)[:120]})")  # fmt: skip
            judged = _judge(model, quantizer, x, [mine[o] for o in results[name]],
                            [theirs[o] for o in results[name]])  # fmt: skip
            if isinstance(judged, str):
                return Arbitration(tuple(divergences), None, rtol, judged)
            divergences.append(judged)
            given.update((o, mine[o]) for o in results[name])
    return Arbitration(tuple(divergences), None, rtol, f"quantizers still differ after {MAX_ROUNDS} rounds")
