"""The description memo: one description per candidate inside `remembering()`, none kept outside it, and
never one graph's description for another graph's kernel with the same node indices."""

from __future__ import annotations

import pytest

import kernorch.codegen.gir.memo as memo
from kernorch.codegen.backends import GENERATED_C, choose_backend
from kernorch.codegen.loops.description import NotGeneratable, construct, describe, simplified
from kernorch.devtools.mutate import here
from kernorch.ir.graph import Graph, Node
from kernorch.ir.kernel import make_kernel
from kernorch.ir.types import TensorType


def _graph(prim: str) -> Graph:
    graph = Graph(inputs=["x"], outputs=["y"])
    graph.types["x"] = graph.types["y"] = TensorType((64, 64), "float32")
    graph.nodes.append(Node(prim, ("x",), ("y",), ()))
    return graph


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []

    def counted(kernel):  # type: ignore[no-untyped-def]
        calls.append(1)
        return construct(kernel)

    monkeypatch.setattr(memo, "construct", counted)
    return calls


def test_a_candidate_is_described_once_while_remembering(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _counting(monkeypatch)
    kernel = make_kernel(_graph("exp"), (0,), ("y",))
    with memo.remembering():
        choose_backend(kernel)
        first = GENERATED_C.source("k", kernel)
        memo.rewritten(kernel)
        assert len(calls) == 1
    assert GENERATED_C.source("k", kernel) == first and len(calls) == 2  # outside the block: described again


def test_the_backend_verdict_leaves_the_indices_unsimplified(monkeypatch: pytest.MonkeyPatch) -> None:
    """Choosing the backend constructs the description (every refusal is made there) without simplifying it; the
    source simplifies it once, and the result is `describe`'s."""
    simplifications: list[int] = []

    def counted(loops):  # type: ignore[no-untyped-def]
        simplifications.append(1)
        return simplified(loops)

    monkeypatch.setattr(memo, "simplified", counted)
    kernel = make_kernel(_graph("exp"), (0,), ("y",))
    with memo.remembering():
        assert choose_backend(kernel)[0] is GENERATED_C and not simplifications
        GENERATED_C.source("k", kernel)
        memo.rewritten(kernel)
        assert len(simplifications) == 1
        assert memo.described(kernel) == describe(kernel)


def test_another_graph_with_the_same_node_indices_is_described_for_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    _counting(monkeypatch)
    exp, tanh = (make_kernel(_graph(prim), (0,), ("y",)) for prim in ("exp", "tanh"))
    with memo.remembering():
        assert "exp" in GENERATED_C.source("k", exp) and "tanh" in GENERATED_C.source("k", tanh)


def test_a_refusal_is_remembered_and_raised_again(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _counting(monkeypatch)
    graph = _graph("exp")
    graph.nodes[0] = Node("matmul", ("x", "x"), ("y",), ())  # a linear primitive: the library's, not generated
    kernel = make_kernel(graph, (0,), ("y",))
    with memo.remembering():
        for _ in range(2):
            with pytest.raises(NotGeneratable):
                memo.described(kernel)
    assert len(calls) == 1


# The mutants of the code this file tests, each a one-line change a real bug could make and that these tests must
# catch (`make mutate`: kernorch/devtools/mutate.py collects them)
MUTANTS = [
    here("the description memo outlives its block",
         "        _active.pop()",
         "        pass"),
]  # fmt: skip
