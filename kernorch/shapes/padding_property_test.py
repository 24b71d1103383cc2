"""The padding proof against values, not just shapes: random small graphs in which the batch size reaches the
computation through Shape → arithmetic → Slice / Range / Gather / Pad / Tile / Expand / division / comparison /
Clip (as a value) or only as a shape (Reshape, Expand, a position table sliced to the batch), padded where the
proof accepts and compared with onnxruntime at the unpadded size. An accepted case whose rows differ is a wrong
answer the proof let through: there must be none.

The graphs run through the reference interpreter on the bucket's primitive graph (the plan's graph before
orchestration: what the proof reasons about); kernorch/shapes/dynamic_test.py runs padding through compiled plans.
`make test` runs GRAPHS (2 000) graphs, in four seeded quarters; KERNORCH_PADDING_GRAPHS=N for more."""

from __future__ import annotations

import os
import warnings
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from kernorch.devtools.mutate import here
from kernorch.errors import KernorchError
from kernorch.fission import fission
from kernorch.frontend import import_model, input_signature
from kernorch.runtime.reference import run_reference
from kernorch.shapes import prove_paddable
from kernorch.shapes.padding import NotProven, _same_program

GRAPHS = int(os.environ.get("KERNORCH_PADDING_GRAPHS", "2000"))
WIDTH = 6


@dataclass
class Builder:
    """One random graph: x int64 [batch, WIDTH]; n = its batch size as an int64 [1]; terms added into y."""

    rng: np.random.Generator
    nodes: list[onnx.NodeProto]
    constants: dict[str, np.ndarray]
    terms: list[str]
    counter: int = 0
    plain: bool = False  # the size itself, no arithmetic on it

    def name(self, hint: str) -> str:
        self.counter += 1
        return f"{hint}{self.counter}"

    def const(self, value: np.ndarray, hint: str = "c") -> str:
        name = self.name(hint)
        self.constants[name] = value
        return name

    def node(self, op: str, inputs: list[str], **attrs: Any) -> str:
        out = self.name(op.lower())
        self.nodes.append(helper.make_node(op, inputs, [out], **attrs))
        return out

    def ints(self, *values: int) -> str:
        return self.const(np.array(values, np.int64))

    def size_value(self) -> str:
        """The batch size, through Shape, then a little arithmetic: n, n + c, n * c, n - c (>= 1 kept), n // c."""
        n = self.node("Shape", ["x"], start=0, end=1)
        op = "none" if self.plain else self.rng.choice(["none", "Add", "Mul", "Sub", "Div", "Mod"])
        c = int(self.rng.integers(1, 4))
        if op == "none":
            return n
        if op == "Sub":
            return self.node("Max", [self.node("Sub", [n, self.ints(c)]), self.ints(1)])
        return self.node(str(op), [n, self.ints(c)])

    def row_term(self, value: str) -> str:
        """A [batch, k] term reduced to [batch, 1] (row-wise), so terms of any width add up."""
        return self.node("ReduceSum", [value, self.ints(1)], keepdims=1)

    # each consumer adds one term broadcastable to [batch, WIDTH]
    def add_value(self) -> str:  # x + f(n): the size as a value
        return self.node("Add", ["x", self.size_value()])

    def divide(self) -> str:
        return self.node("Div", ["x", self.node("Max", [self.size_value(), self.ints(1)])])

    def compare(self) -> str:
        return self.node("Cast", [self.node("Less", ["x", self.size_value()])], to=TensorProto.INT64)

    def clip(self) -> str:
        bound = self.node("Squeeze", [self.size_value(), self.ints(0)])
        return self.node("Clip", ["x", self.const(np.array(-3, np.int64)), bound])

    def pad_value(self) -> str:  # constant padding whose value is the size
        value = self.node("Squeeze", [self.size_value(), self.ints(0)])
        padded = self.node("Pad", ["x", self.ints(0, 1, 0, 1), value])
        return self.row_term(padded)

    def pad_amount(self) -> str:  # pad by f(n) at the start of a row and crop as much at its end: same width
        amount = self.node("Min", [self.size_value(), self.ints(WIDTH - 1)])
        negative = self.node("Neg", [amount])
        pads = self.node("Concat", [self.ints(0), amount, self.ints(0), negative], axis=0)
        return self.node("Pad", ["x", pads])

    def slice_step(self) -> str:
        step = self.node("Max", [self.size_value(), self.ints(1)])
        return self.row_term(self.node("Slice", ["x", self.ints(0), self.ints(WIDTH), self.ints(1), step]))

    def slice_table(self) -> str:  # one row of a table picked by f(n)
        table = self.const(self.rng.integers(-9, 9, (16, WIDTH)).astype(np.int64), "table")
        start = self.node("Mod", [self.size_value(), self.ints(15)])
        return self.node("Slice", [table, start, self.node("Add", [start, self.ints(1)]), self.ints(0)])

    def gather_table(self) -> str:
        table = self.const(self.rng.integers(-9, 9, (16, WIDTH)).astype(np.int64), "table")
        index = self.node("Mod", [self.size_value(), self.ints(16)])
        return self.node("Gather", [table, index], axis=0)

    def tile(self) -> str:
        repeats = self.node("Concat", [self.ints(1), self.node("Min", [self.size_value(), self.ints(4)])], axis=0)
        return self.row_term(self.node("Tile", ["x", repeats]))

    def range_values(self) -> str:  # Range(f(n)) summed: a value of the size
        limit = self.node("Squeeze", [self.node("Min", [self.size_value(), self.ints(9)]), self.ints(0)])
        values = self.node("Range", [self.const(np.array(0, np.int64)), limit, self.const(np.array(1, np.int64))])
        return self.node("ReduceSum", [values, self.ints(0)], keepdims=1)

    def positions(self) -> str:  # the size only as a shape: a position table sliced to the batch, row i gets i
        n = self.node("Shape", ["x"], start=0, end=1)
        table = self.const(np.arange(16 * WIDTH, dtype=np.int64).reshape(16, WIDTH), "positions")
        return self.node("Slice", [table, self.ints(0), n, self.ints(0)])

    def range_rows(self) -> str:  # Range(0, n) as a column: row i gets i
        n = self.node("Squeeze", [self.node("Shape", ["x"], start=0, end=1), self.ints(0)])
        column = self.node("Range", [self.const(np.array(0, np.int64)), n, self.const(np.array(1, np.int64))])
        return self.node("Unsqueeze", [column, self.ints(1)])

    def reshape_rows(self) -> str:  # Reshape to [n, -1] and back: a shape only
        n = self.node("Shape", ["x"], start=0, end=1)
        flat = self.node("Reshape", ["x", self.node("Concat", [n, self.ints(-1)], axis=0)])
        return self.node("Neg", [flat])

    def expand_rows(self) -> str:
        n = self.node("Shape", ["x"], start=0, end=1)
        row = self.const(self.rng.integers(-5, 5, (1, WIDTH)).astype(np.int64), "row")
        return self.node("Expand", [row, self.node("Concat", [n, self.ints(WIDTH)], axis=0)])

    def batch_sum(self) -> str:  # rows meet: never paddable
        return self.node("ReduceSum", ["x", self.ints(0)], keepdims=1)

    def cumsum(self) -> str:
        return self.node("CumSum", ["x", self.const(np.array(0, np.int64))])


VALUE_USES = ("add_value", "divide", "compare", "clip", "pad_value", "pad_amount", "slice_step", "slice_table",
              "gather_table", "tile", "range_values", "batch_sum", "cumsum")  # fmt: skip
SHAPE_USES = ("positions", "range_rows", "reshape_rows", "expand_rows")


def random_graph(rng: np.random.Generator, kinds: tuple[str, ...] = ()) -> tuple[onnx.ModelProto, tuple[str, ...]]:
    """A graph of 1-3 random uses (or of `kinds`, with the size unaltered)."""
    builder = Builder(rng, [], {}, [], plain=bool(kinds))
    chosen = list(kinds) or [str(rng.choice(VALUE_USES if rng.random() < 0.6 else SHAPE_USES))
                             for _ in range(int(rng.integers(1, 4)))]  # fmt: skip
    for kind in chosen:
        builder.terms.append(getattr(builder, kind)())
    total = "x"
    for term in builder.terms:
        total = builder.node("Add", [total, term])
    builder.nodes[-1].output[0] = "y"
    graph = helper.make_graph(builder.nodes, "padding", [helper.make_tensor_value_info("x", TensorProto.INT64,
                              ["batch", WIDTH])], [helper.make_tensor_value_info("y", TensorProto.INT64,
                              ["batch", WIDTH])], [numpy_helper.from_array(v, k) for k, v in builder.constants.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), tuple(chosen)


def _onnxruntime(model: bytes, x: np.ndarray) -> np.ndarray:
    options = ort.SessionOptions()
    options.log_severity_level = 4
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    return session.run(["y"], {"x": x})[0]


@dataclass
class ReferencePlan:
    """The bucket's primitive graph run by the reference interpreter, as a plan the proof can run."""

    model: bytes
    bucket: int

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        graph = fission(import_model(self.model, {"x": (self.bucket, WIDTH)}))
        return run_reference(graph, feeds)


@pytest.mark.parametrize("seed", range(4))
def test_no_padding_the_proof_accepts_is_wrong(seed: int) -> None:
    rng = np.random.default_rng(1000 + seed)
    outcome: Counter[str] = Counter()
    accepted_kinds: Counter[str] = Counter()
    wrong = []
    graphs = 0
    while graphs < GRAPHS // 4:
        model_proto, kinds = random_graph(rng)
        model = model_proto.SerializeToString()
        size = int(rng.integers(1, 8))
        bucket = int(rng.integers(size + 1, 10))
        x = rng.integers(-20, 20, (size, WIDTH)).astype(np.int64)
        try:
            expected = _onnxruntime(model, x)
            _onnxruntime(model, np.resize(x, (bucket, WIDTH)))
        except Exception:  # noqa: BLE001 - a graph onnxruntime itself refuses at one of the sizes: not a case
            outcome["invalid"] += 1
            continue
        graphs += 1
        signature = input_signature(model)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                proof = prove_paddable(model, signature, ("batch",), {"batch": bucket}, {"batch": size})
            except KernorchError:
                outcome["refused (no fission rule)"] += 1
                continue
            if not proof.exact:
                outcome["refused"] += 1
                continue
            outcome["accepted"] += 1
            accepted_kinds.update(kinds)
            with np.errstate(all="ignore"):
                actual = proof.run(ReferencePlan(model, bucket), {"x": x})["y"]
        if actual.shape != expected.shape or not np.array_equal(actual, expected):
            wrong.append((kinds, size, bucket))
    print(f"\nseed {seed}: {graphs} graphs, {dict(outcome)}; accepted graphs used {dict(accepted_kinds)}")
    assert not wrong, f"{len(wrong)} accepted-but-wrong: {wrong[:5]}"
    assert outcome["accepted"] > 0 and outcome["refused"] > 0  # both verdicts are reached


# (use, call size, bucket size): sizes where the use changes values but no shape (a step of 3 or 4 over 6 columns
# keeps 2; a pad of n at the start cropped at the end keeps the width): the shape checks alone let these through
VALUE_CASES = [("pad_value", 3, 8), ("slice_step", 3, 4), ("pad_amount", 2, 3), ("clip", 3, 8), ("add_value", 3, 8),
               ("divide", 3, 8), ("gather_table", 3, 8), ("range_values", 3, 8), ("compare", 3, 8)]  # fmt: skip
SHAPE_CASES = [(kind, 3, 8) for kind in SHAPE_USES]


@pytest.mark.parametrize("kind, size, bucket", VALUE_CASES)
def test_each_use_of_the_size_as_a_value_is_refused_naming_the_primitive(kind: str, size: int, bucket: int) -> None:
    model = random_graph(np.random.default_rng(5), (kind,))[0].SerializeToString()
    x = np.arange(size * WIDTH, dtype=np.int64).reshape(size, WIDTH) - 7
    padded = np.pad(x, [(0, bucket - size), (0, 0)], mode="edge")
    assert not np.array_equal(_onnxruntime(model, padded)[:size], _onnxruntime(model, x))  # padding would be wrong
    proof = prove_paddable(model, input_signature(model), ("batch",), {"batch": bucket}, {"batch": size})
    assert not proof.exact
    assert proof.reason.split(" ")[0] in {"slice", "pad", "add", "div", "where", "max", "min", "gather", "less",
                                          "constant", "reduce_sum"}, proof.reason  # fmt: skip


@pytest.mark.parametrize("kind, size, bucket", SHAPE_CASES)
def test_each_use_of_the_size_as_a_shape_is_accepted_and_exact(kind: str, size: int, bucket: int) -> None:
    model = random_graph(np.random.default_rng(5), (kind,))[0].SerializeToString()
    x = np.arange(size * WIDTH, dtype=np.int64).reshape(size, WIDTH) - 7
    proof = prove_paddable(model, input_signature(model), ("batch",), {"batch": bucket}, {"batch": size})
    assert proof.exact, proof.reason
    np.testing.assert_array_equal(proof.run(ReferencePlan(model, bucket), {"x": x})["y"], _onnxruntime(model, x))


def test_a_size_in_an_attribute_that_is_no_shape_is_refused() -> None:
    """Condition 1 on its own: a pad's value that is 8 at the bucket and 3 at the call is k·P against k·n, as a
    shape would be, but a pad value is read as a value. (Fission keeps it a numpy scalar, which differs from
    itself at the two sizes anyway; the rule must not lean on that.)"""
    model = random_graph(np.random.default_rng(5), ("pad_value",))[0].SerializeToString()
    at_bucket, at_call = (fission(import_model(model, {"x": (size, WIDTH)})) for size in (8, 3))
    for graph, size in ((at_bucket, 8), (at_call, 3)):
        graph.nodes = [replace(n, attrs=tuple((k, size if k == "value" else v) for k, v in n.attrs))
                       if n.prim == "pad" else n for n in graph.nodes]  # fmt: skip
    with pytest.raises(NotProven, match=r"pad \(.*\) reads the size as a value \(its attribute value\)"):
        _same_program(at_bucket, at_call, {"batch": (8, 3)})


# The mutants of the code this file tests, each a one-line change a real bug could make and that these tests must
# catch (`make mutate`: kernorch/devtools/mutate.py collects them)
MUTANTS = [
    here("a slice's step may follow the padded size (3 or 4 over 6 columns keeps 2)",
         "a[0] == b[0] and a[2] == b[2] and",
         "a[0] == b[0] and",
         file="kernorch/shapes/padding.py"),
    here("a size in any attribute counts as a shape",
         "            if key not in SIZE_ATTRIBUTES.get(a.prim, ()):",
         "            if False:",
         file="kernorch/shapes/padding.py",
         tests=("kernorch/shapes/padding_property_test.py", "kernorch/shapes/padding_test.py")),
]  # fmt: skip
