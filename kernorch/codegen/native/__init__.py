"""Hand-written kernels, one family per module, each declaring the backend that runs it (`BACKEND`, listed in the
order of codegen/backends/registry.py), its test beside it (`<family>_test.py`, with its mutants and the marker
that puts it under the sanitizers):

- library calls (`LibraryCallBackend`: created once with the weights packed, run per call, destroyed, like oneDNN's)
  for the shapes oneDNN handles worst: `direct_conv` (few output channels), `depthwise_conv`, `grouped_conv` (groups
  of 4, 8 or a multiple of 16 channels without AVX-512), `pointwise_conv` (1x1 with a transcendental epilogue in
  cache),
  `panel_conv` (1x1 over more input channels, relu among its epilogues, without AVX-512), `panel_matmul` (float32
  matmuls with constant weights on the same register blocks, each weight read once per pass, without AVX-512),
  `few_channel_conv` (an image's three channels), `winograd_conv` (F(2x2, 3x3)), `streaming_product` (few rows,
  weights read once), `amx_matmul` (bf16 on AMX tiles, and convolutions folded into it, amx_conv.py), `int8_matmul`
  (integer products on AVX512-VNNI, their dequantizing or requantizing epilogue in registers);
- C templates (`CTemplate`) for opaque primitives and patterns: `lstm` (the scan), `lstm_stack` (stacked layers as
  waves), `attention` (QKᵀ, softmax, ·V per block of query rows; its AMX variant in attention_amx.py).

skeleton.py and amx_product.py hold what several families share (the create/run/destroy frame, AMX tile set-up);
preambles.py the fixed C helpers they include (AVX-512 exp, AMX tile support). Every family writes its C through
codegen/c/writer.py's CWriter.
"""
