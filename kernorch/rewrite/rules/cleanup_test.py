"""Clean-up rules: each asserts the primitives left and numerical equality on random inputs."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kernorch.ir.graph import Node
from kernorch.testing.rewrite import assert_equivalent, build, const, emit, prims, rewrite_with

SETTINGS = settings(max_examples=15, deadline=None, derandomize=True)
shapes = st.lists(st.integers(1, 5), min_size=1, max_size=4).map(tuple)


@SETTINGS
@given(shape=shapes)
def test_cse_reuses_the_first_of_two_equal_nodes(shape: tuple[int, ...]) -> None:
    def body(b):  # type: ignore[no-untyped-def]
        first, second = emit(b, "exp", "x"), emit(b, "exp", "x")
        return emit(b, "add", first, second)

    graph = build({"x": shape}, body)
    rewritten, fired = rewrite_with(graph, "cse")
    assert prims(rewritten) == ["exp", "add"] and fired == ["cse"]
    assert_equivalent(graph, rewritten)


def test_cse_keeps_nodes_that_differ_in_attributes() -> None:
    graph = build({"x": (2, 3)}, lambda b: emit(b, "add", emit(b, "reduce_sum", "x", axes=(0,)),
                                                emit(b, "reduce_sum", "x", axes=(1,))))  # fmt: skip
    rewritten, fired = rewrite_with(graph, "cse")
    assert not fired and prims(rewritten) == prims(graph)


@SETTINGS
@given(shape=shapes)
def test_constant_fold_evaluates_nodes_with_only_constant_inputs(shape: tuple[int, ...]) -> None:
    graph = build({"x": shape}, lambda b: emit(b, "add", "x", const(b, np.ones(shape[-1]))))
    # the builder folds as it goes; append an all-constant chain by hand, as another rewrite could leave it
    c1, c2 = next(iter(graph.constants)), "two"
    graph.constants[c2] = np.full(shape[-1], 2.0, np.float32)
    graph.types[c2] = graph.types["sum"] = graph.types["scaled"] = graph.types[c1]
    graph.nodes[0:0] = [Node("add", (c1, c2), ("sum",)), Node("exp", ("sum",), ("scaled",))]
    graph.nodes[-1] = Node("add", ("x", "scaled"), graph.nodes[-1].outputs)
    rewritten, fired = rewrite_with(graph, "constant-fold")
    assert prims(rewritten) == ["add"] and fired == ["constant-fold", "constant-fold"]
    assert_equivalent(graph, rewritten)


def test_constant_fold_leaves_a_large_expansion_alone() -> None:
    graph = build({"x": (1024, 512)}, lambda b: emit(b, "add", "x", const(b, 1.0)))
    graph.types["big"] = graph.types["x"]
    graph.nodes[0:0] = [Node("expand", (next(iter(graph.constants)),), ("big",), (("shape", (1024, 512)),))]
    graph.nodes[-1] = Node("add", ("x", "big"), graph.nodes[-1].outputs)
    assert not rewrite_with(graph, "constant-fold")[1]


@SETTINGS
@given(shape=shapes)
def test_identity_cast_reshape_expand_to_same_are_removed(shape: tuple[int, ...]) -> None:
    def body(b):  # type: ignore[no-untyped-def]
        y = emit(b, "identity", emit(b, "exp", "x"))
        y = emit(b, "cast", y, to="float32")
        y = emit(b, "reshape", emit(b, "reshape", y, shape=(int(np.prod(shape)),)), shape=shape)
        return emit(b, "neg", emit(b, "expand", y, shape=shape))

    graph = build({"x": shape}, body)
    rewritten, _ = rewrite_with(graph, "identity", "cast-same-type", "reshape-noop")
    assert prims(rewritten) == ["exp", "neg"]
    assert_equivalent(graph, rewritten)


def test_reshape_of_reshape_becomes_one_reshape() -> None:
    graph = build({"x": (2, 3, 4)}, lambda b: emit(b, "exp", emit(b, "reshape", emit(b, "reshape", "x", shape=(6, 4)),
                                                                  shape=(3, 8))))  # fmt: skip
    rewritten, _ = rewrite_with(graph, "reshape-noop")
    assert prims(rewritten) == ["reshape", "exp"]
    assert_equivalent(graph, rewritten)


@SETTINGS
@given(perms=st.permutations(range(4)).flatmap(lambda p: st.tuples(st.just(tuple(p)), st.permutations(range(4)))))
def test_transpose_of_transpose_composes_or_cancels(perms: tuple[tuple[int, ...], list[int]]) -> None:
    first, second = perms[0], tuple(perms[1])
    graph = build({"x": (2, 3, 4, 5)}, lambda b: emit(b, "exp", emit(b, "transpose", emit(b, "transpose", "x",
                                                                                          perm=first), perm=second)))
    rewritten, _ = rewrite_with(graph, "transpose-noop")
    identity = tuple(first[a] for a in second) == (0, 1, 2, 3)
    assert prims(rewritten) == (["exp"] if identity else ["transpose", "exp"])
    assert_equivalent(graph, rewritten)


def test_a_free_swap_into_a_matmul_is_not_merged_into_the_copy_before_it() -> None:
    def body(b):  # type: ignore[no-untyped-def]
        rows = emit(b, "transpose", "x", perm=(0, 2, 1, 3))
        return emit(b, "matmul", "y", emit(b, "transpose", rows, perm=(0, 1, 3, 2)))

    graph = build({"x": (2, 3, 4, 5), "y": (2, 4, 6, 5)}, body)
    rewritten, fired = rewrite_with(graph, "transpose-noop")
    assert not fired and prims(rewritten) == ["transpose", "transpose", "matmul"]


@SETTINGS
@given(rows=st.integers(1, 4), columns=st.integers(1, 4))
def test_layout_noops(rows: int, columns: int) -> None:
    def body(b):  # type: ignore[no-untyped-def]
        y = emit(b, "pad", "x", pads=(0, 0, 0, 0), mode="constant", value=0.0)
        y = emit(b, "slice", y, ranges=((0, rows, 1), (0, columns, 1)))
        y = emit(b, "concat", y, axis=0)
        (y,) = b.emit("split", [y], {"axis": 1, "sizes": (columns,)})
        return emit(b, "reduce_sum", emit(b, "exp", y), axes=(0,))

    graph = build({"x": (rows, columns)}, body)
    rewritten, _ = rewrite_with(graph, "layout-noop")
    assert prims(rewritten) == ["exp", "reduce_sum"]
    assert_equivalent(graph, rewritten)


def test_partial_slice_and_real_pad_stay() -> None:
    graph = build({"x": (2, 3)}, lambda b: emit(b, "pad", emit(b, "slice", "x", ranges=((0, 2, 1), (1, 3, 1))),
                                                pads=(0, 1, 0, 0), mode="constant", value=0.0))  # fmt: skip
    _, fired = rewrite_with(graph, "layout-noop")
    assert not fired


@SETTINGS
@given(shape=shapes, reducer=st.sampled_from(["reduce_sum", "reduce_max", "reduce_min", "reduce_prod"]))
def test_reduction_over_unit_axes_is_the_input(shape: tuple[int, ...], reducer: str) -> None:
    full = (*shape, 1)
    graph = build({"x": full}, lambda b: emit(b, "exp", emit(b, reducer, "x", axes=(len(shape),))))
    rewritten, _ = rewrite_with(graph, "reduce-noop")
    assert prims(rewritten) == ["exp"]
    assert_equivalent(graph, rewritten)


@SETTINGS
@given(shape=shapes, prim=st.sampled_from(["mul", "add", "sub", "div", "pow"]), left=st.booleans())
def test_neutral_operands_are_dropped(shape: tuple[int, ...], prim: str, left: bool) -> None:
    neutral = 1.0 if prim in ("mul", "div", "pow") else 0.0
    commutes = prim in ("mul", "add")

    def body(b):  # type: ignore[no-untyped-def]
        constant = const(b, np.full(shape[-1:], neutral))
        operands = (constant, "x") if left and commutes else ("x", constant)
        return emit(b, "exp", emit(b, prim, *operands))

    graph = build({"x": shape}, body)
    rewritten, _ = rewrite_with(graph, "neutral-operand")
    assert prims(rewritten) == ["exp"]
    assert_equivalent(graph, rewritten)


def test_a_neutral_operand_that_broadcasts_the_input_larger_stays() -> None:
    graph = build({"x": (1, 3)}, lambda b: emit(b, "mul", "x", const(b, np.ones((4, 3)))))
    _, fired = rewrite_with(graph, "neutral-operand")
    assert not fired
