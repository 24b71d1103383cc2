"""Three small models of the zoo (`make zoo`, bench/zoo/export.py), committed: an encoder with an attention mask
(BERT), a decoder stepping one token over a KV cache (GPT-2, past keys and values as inputs), and a hybrid
convolution + attention segmenter (SegFormer). Each compiled plan matches onnxruntime, concurrent calls included."""

from __future__ import annotations

import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

import kernorch
from kernorch.errors import FallbackWarning
from kernorch.options import Options
from kernorch.runtime.feeds import graph_feeds
from kernorch.tools.check import check_model

ZOO = Path(__file__).parent / "zoo"


# SegFormer (30 s) in `make test-slow`: the shared segformer_b0 covers its operators in `make test`
@pytest.mark.parametrize("name", ["bert", "gpt2_kv_cache", pytest.param("hf_segformer", marks=pytest.mark.slow)])
def test_a_zoo_model_compiles_and_matches_onnxruntime(name: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)  # every operator has a rule: nothing falls back
        # SegFormer channels-last only: the auto layout would orchestrate it twice (30 s more; auto is covered on
        # the shared segformer_b0 by test_orchestrate_models in `make test-slow`)
        options = Options(cost="analytic", layout="channels-last" if name == "hf_segformer" else "auto")
        report, _ = check_model(ZOO / f"{name}.onnx", compiled=True, options=options)
    assert report.passed, report.lines()


def test_the_kv_cache_decoder_serves_concurrent_steps() -> None:
    compiled = kernorch.compile(ZOO / "gpt2_kv_cache.onnx", cost="analytic")
    steps = [graph_feeds(compiled.graph, seed) for seed in range(8)]
    alone = [compiled.run(feeds) for feeds in steps]
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(compiled.run, steps * 3))
    for i, outputs in enumerate(together):
        for output, value in outputs.items():
            np.testing.assert_array_equal(value, alone[i % len(steps)][output])
