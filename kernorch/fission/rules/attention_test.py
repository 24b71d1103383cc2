"""Attention (opset 23): the primitives it becomes and equality with the ONNX reference implementation
(onnx.reference), through the reference interpreter and the compiled plan."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import helper
from onnx.reference import ReferenceEvaluator

import kernorch
from kernorch.fission import fission
from kernorch.frontend import import_model
from kernorch.runtime import run_reference
from kernorch.testing import primitive_names, random_array


def _model(inputs: Mapping[str, np.ndarray | None], attrs: Mapping[str, Any], outputs: int = 1) -> onnx.ModelProto:
    names = [name if value is not None else "" for name, value in inputs.items()]
    node = helper.make_node("Attention", names, ["y", "present_key", "present_value", "qk"][:outputs], **attrs)
    graph_inputs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
                    for n, a in inputs.items() if a is not None]  # fmt: skip
    graph = helper.make_graph([node], "attention", graph_inputs,
                              [helper.make_empty_tensor_value_info(o) for o in node.output])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)], ir_version=10)
    results = ReferenceEvaluator(model).run(None, {n: a for n, a in inputs.items() if a is not None})
    del model.graph.output[:]
    model.graph.output.extend(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(r.dtype), r.shape)
                              for name, r in zip(node.output, results, strict=True))  # fmt: skip
    return model


Q4, K4, V4 = random_array((2, 4, 3, 8)), random_array((2, 2, 5, 8), seed=1), random_array((2, 2, 5, 6), seed=2)
MASK = np.random.default_rng(3).random((3, 5)) > 0.3
MASK[1] = False  # a fully masked row: zeros, not NaN
CASES: dict[str, tuple[dict[str, np.ndarray], dict[str, Any], int]] = {
    "gqa": ({"Q": Q4, "K": K4, "V": V4}, {}, 1),
    "causal-softcap-scale": ({"Q": Q4, "K": K4, "V": V4}, {"is_causal": 1, "softcap": 2.0, "scale": 0.3}, 1),
    "bool-mask-qk-output": ({"Q": Q4, "K": K4, "V": V4, "attn_mask": MASK}, {"qk_matmul_output_mode": 3}, 4),
    "3d-past-present": ({"Q": random_array((1, 3, 16)), "K": random_array((1, 3, 8), seed=4),
                         "V": random_array((1, 3, 8), seed=5), "attn_mask": random_array((3, 5), seed=6),
                         "past_key": random_array((1, 2, 2, 4), seed=7),
                         "past_value": random_array((1, 2, 2, 4), seed=8)},
                        {"q_num_heads": 4, "kv_num_heads": 2, "is_causal": 1}, 3),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_attention_matches_the_onnx_reference(case: str) -> None:
    inputs, attrs, outputs = CASES[case]
    model = _model(inputs, attrs, outputs)
    feeds = {n: a for n, a in inputs.items() if a is not None}
    expected = ReferenceEvaluator(model).run(None, feeds)
    graph = fission(import_model(model))
    assert primitive_names(graph).count("matmul") == 2 and "exp" in primitive_names(graph)
    for got in (run_reference(graph, feeds), kernorch.compile(model, cost="analytic", device="cpu-nominal").run(feeds)):
        for name, reference in zip(["y", "present_key", "present_value", "qk"], expected, strict=False):
            assert not np.isnan(got[name]).any()
            np.testing.assert_allclose(got[name], reference, rtol=1e-5, atol=1e-5, err_msg=f"{case}: {name}")
