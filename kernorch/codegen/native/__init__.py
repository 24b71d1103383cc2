"""Hand-written kernels: a bf16 matmul on AMX tiles and convolutions for the shapes oneDNN handles worst (direct,
depthwise, Winograd, 1x1 with a transcendental epilogue, over few input
channels, a product over few rows that streams its weights once), with a library call's create/run/destroy shape; C
templates for opaque primitives (the LSTM scan, stacked LSTM layers as waves) and for fused attention (QKᵀ,
softmax, ·V per block of query rows). Their backends are codegen/backends/library_calls.py and templates.py."""

from kernorch.codegen.native.amx_matmul import amx_matmul_rejection, render_amx_matmul
from kernorch.codegen.native.amx_product import amx_supported
from kernorch.codegen.native.attention import (
    attention_scratch_bytes,
    attention_supported,
    describe_attention,
    render_attention,
)
from kernorch.codegen.native.depthwise_conv import depthwise_rejection, render_depthwise_conv
from kernorch.codegen.native.direct_conv import direct_conv_rejection, render_direct_conv
from kernorch.codegen.native.few_channel_conv import few_channel_rejection, render_few_channel_conv
from kernorch.codegen.native.lstm import describe_lstm, lstm_scratch_bytes, lstm_supported, render_lstm
from kernorch.codegen.native.lstm_stack import (
    describe_lstm_stack,
    lstm_stack_scratch_bytes,
    lstm_stack_supported,
    render_lstm_stack,
)
from kernorch.codegen.native.pointwise_conv import pointwise_rejection, render_pointwise_conv
from kernorch.codegen.native.streaming_product import render_streaming_product, streaming_rejection
from kernorch.codegen.native.winograd_conv import render_winograd_conv, winograd_rejection

__all__ = [
    "amx_matmul_rejection",
    "amx_supported",
    "render_amx_matmul",
    "attention_scratch_bytes",
    "attention_supported",
    "describe_attention",
    "render_attention",
    "depthwise_rejection",
    "describe_lstm",
    "describe_lstm_stack",
    "direct_conv_rejection",
    "few_channel_rejection",
    "lstm_scratch_bytes",
    "lstm_stack_scratch_bytes",
    "lstm_stack_supported",
    "lstm_supported",
    "render_depthwise_conv",
    "render_direct_conv",
    "render_few_channel_conv",
    "render_lstm",
    "render_lstm_stack",
    "pointwise_rejection",
    "render_pointwise_conv",
    "render_streaming_product",
    "streaming_rejection",
    "render_winograd_conv",
    "winograd_rejection",
]
