"""Small models built into the package with onnx.helper, for `kernorch demo` and the tests."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def _init(name: str, array: np.ndarray) -> TensorProto:
    return numpy_helper.from_array(array.astype(np.float32) if array.dtype.kind == "f" else array, name)


def self_attention_block(seq: int = 64, hidden: int = 128, heads: int = 4, seed: int = 0) -> onnx.ModelProto:
    """Pre-norm multi-head self-attention with a residual: the Transformer block of Korch Fig. 2/4."""
    rng = np.random.default_rng(seed)
    head_dim = hidden // heads
    weights = {
        "ln_scale": 1 + 0.1 * rng.standard_normal(hidden), "ln_bias": 0.1 * rng.standard_normal(hidden),
        "w_q": rng.standard_normal((hidden, hidden)) / np.sqrt(hidden),
        "w_k": rng.standard_normal((hidden, hidden)) / np.sqrt(hidden),
        "w_v": rng.standard_normal((hidden, hidden)) / np.sqrt(hidden),
        "w_o": rng.standard_normal((hidden, hidden)) / np.sqrt(hidden),
        "b_o": 0.1 * rng.standard_normal(hidden),
        "scale": np.array(np.sqrt(head_dim)),
        "heads_shape": np.array([1, seq, heads, head_dim], dtype=np.int64),
        "merged_shape": np.array([1, seq, hidden], dtype=np.int64),
    }  # fmt: skip
    nodes = [
        helper.make_node("LayerNormalization", ["x", "ln_scale", "ln_bias"], ["normed"], axis=-1, epsilon=1e-5),
        helper.make_node("MatMul", ["normed", "w_q"], ["q"]),
        helper.make_node("MatMul", ["normed", "w_k"], ["k"]),
        helper.make_node("MatMul", ["normed", "w_v"], ["v"]),
        helper.make_node("Reshape", ["q", "heads_shape"], ["q4"]),
        helper.make_node("Reshape", ["k", "heads_shape"], ["k4"]),
        helper.make_node("Reshape", ["v", "heads_shape"], ["v4"]),
        helper.make_node("Transpose", ["q4"], ["qh"], perm=[0, 2, 1, 3]),
        helper.make_node("Transpose", ["k4"], ["kh_t"], perm=[0, 2, 3, 1]),
        helper.make_node("Transpose", ["v4"], ["vh"], perm=[0, 2, 1, 3]),
        helper.make_node("MatMul", ["qh", "kh_t"], ["scores_raw"]),
        helper.make_node("Div", ["scores_raw", "scale"], ["scores"]),
        helper.make_node("Softmax", ["scores"], ["probs"], axis=-1),
        helper.make_node("MatMul", ["probs", "vh"], ["context_h"]),
        helper.make_node("Transpose", ["context_h"], ["context_t"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["context_t", "merged_shape"], ["context"]),
        helper.make_node("MatMul", ["context", "w_o"], ["projected"]),
        helper.make_node("Add", ["projected", "b_o"], ["projected_b"]),
        helper.make_node("Add", ["x", "projected_b"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "self_attention",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, seq, hidden])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, seq, hidden])],
        [_init(name, array) for name, array in weights.items()],
    )  # fmt: skip
    return _model(graph)


def conv_norm_act_block(channels: int = 32, size: int = 56, seed: int = 0) -> onnx.ModelProto:
    """Conv → BatchNorm → HardSwish → depthwise Conv → InstanceNorm → Relu, plus a residual."""
    rng = np.random.default_rng(seed)
    c = channels
    weights = {
        "w1": rng.standard_normal((c, c, 3, 3)) / np.sqrt(9 * c), "b1": 0.1 * rng.standard_normal(c),
        "bn_scale": 1 + 0.1 * rng.standard_normal(c), "bn_bias": 0.1 * rng.standard_normal(c),
        "bn_mean": 0.1 * rng.standard_normal(c), "bn_var": 1 + 0.1 * rng.random(c),
        "w2": rng.standard_normal((c, 1, 3, 3)) / 3, "in_scale": 1 + 0.1 * rng.standard_normal(c),
        "in_bias": 0.1 * rng.standard_normal(c),
    }  # fmt: skip
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c1", "bn_scale", "bn_bias", "bn_mean", "bn_var"], ["bn"]),
        helper.make_node("HardSwish", ["bn"], ["act1"]),
        helper.make_node("Conv", ["act1", "w2"], ["c2"], pads=[1, 1, 1, 1], group=c),
        helper.make_node("InstanceNormalization", ["c2", "in_scale", "in_bias"], ["inorm"], epsilon=1e-5),
        helper.make_node("Relu", ["inorm"], ["act2"]),
        helper.make_node("Add", ["x", "act2"], ["y"]),
    ]
    shape = [1, c, size, size]
    graph = helper.make_graph(
        nodes, "conv_norm_act",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
        [_init(name, array) for name, array in weights.items()],
    )  # fmt: skip
    return _model(graph)


def stacked_lstm(layers: int = 4, hidden: int = 64, seq: int = 100, batch: int = 1, features: int = 32,
                 state: bool = False, seed: int = 0) -> onnx.ModelProto:  # fmt: skip
    """Forward LSTM layers one above the other (Squeeze between them), as PyTorch exports nn.LSTM(num_layers=L):
    the shape of the LSTM-TC model of Rammer, small. Outputs the top layer's sequence, h and c. With `state`,
    every layer also has an initial h and c and peepholes (nn.LSTM has none)."""
    rng = np.random.default_rng(seed)
    nodes: list[onnx.NodeProto] = []
    weights: dict[str, np.ndarray] = {"axis": np.array([1], np.int64)}
    below = "x"
    for layer in range(layers):
        width = features if layer == 0 else hidden
        weights[f"w{layer}"] = rng.standard_normal((1, 4 * hidden, width)) * (1.0 / np.sqrt(width))
        weights[f"r{layer}"] = rng.standard_normal((1, 4 * hidden, hidden)) * (1.0 / np.sqrt(hidden))
        weights[f"b{layer}"] = rng.standard_normal((1, 8 * hidden)) * 0.1
        inputs = [below, f"w{layer}", f"r{layer}", f"b{layer}"]
        if state:
            for name, shape in (("h", (1, batch, hidden)), ("c", (1, batch, hidden)), ("p", (1, 3 * hidden))):
                weights[f"{name}{layer}"] = rng.standard_normal(shape) * 0.5
            inputs += ["", f"h{layer}", f"c{layer}", f"p{layer}"]
        top = layer == layers - 1
        nodes.append(helper.make_node("LSTM", inputs, ["y" + str(layer), *(["y_h", "y_c"] if top else [])],
                                      hidden_size=hidden))  # fmt: skip
        below = f"h_seq{layer}" if not top else "h_seq"
        nodes.append(helper.make_node("Squeeze", [f"y{layer}", "axis"], [below]))
    graph = helper.make_graph(
        nodes, "stacked_lstm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [seq, batch, features])],
        [helper.make_tensor_value_info("h_seq", TensorProto.FLOAT, [seq, batch, hidden]),
         *(helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, batch, hidden]) for name in ("y_h", "y_c"))],
        [_init(name, array) for name, array in weights.items()],
    )  # fmt: skip
    return _model(graph)


def _model(graph: onnx.GraphProto) -> onnx.ModelProto:
    # IR version 8 (opset 17 era) so that every onnxruntime of the last few years can load the model.
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="kernorch-demo",
                             ir_version=8)


DEMO_MODELS: dict[str, Callable[[], onnx.ModelProto]] = {
    "self_attention": self_attention_block,
    "conv_norm_act": conv_norm_act_block,
}
